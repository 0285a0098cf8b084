"""``python -m pipeline.drills --tasks DRILLS --output DIR``: a recovery dataset from the recovery drills.

Run from the repository root; the code is :mod:`reterm.data.drills`
(also ``python -m reterm.data.drills`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.data.drills import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

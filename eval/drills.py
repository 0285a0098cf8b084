"""``python -m eval.drills --tasks DRILLS --model NAME=SPEC ... --output DIR``: models on the recovery drills.

Run from the repository root; the code is :mod:`reterm.eval.drills`
(also ``python -m reterm.eval.drills`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.eval.drills import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

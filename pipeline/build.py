"""``python -m pipeline.build --config pipeline/configs/smoke.yaml --output DIR``: build the recovery dataset.

Run from the repository root; the code is :mod:`reterm.data.build`
(also ``python -m reterm.data.build`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.data.build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

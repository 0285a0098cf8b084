"""``python -m eval.run --config eval/configs/NAME.yaml``: evaluate models through Harbor.

Run from the repository root; the code is :mod:`reterm.eval.run`
(also ``python -m reterm.eval.run`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.eval.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

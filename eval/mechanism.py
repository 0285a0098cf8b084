"""``python -m eval.mechanism --model SPEC --output DIR``: learning signal from failure states vs task starts.

Run from the repository root; the code is :mod:`reterm.eval.mechanism`
(also ``python -m reterm.eval.mechanism`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.eval.mechanism import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

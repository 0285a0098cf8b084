"""``python eval/states/build_states.py``: write the held-out failure states ``eval/states/test_split.jsonl``.

Run from the repository root; the code is :mod:`reterm.eval.states`
(also ``python -m reterm.eval.states`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's reterm/ when run as a script

from reterm.eval.states import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""``python model_card/render.py CHECKPOINT --repo-id ORG/NAME --recipe R``: render the model card.

Run from the repository root; the code is :mod:`reterm.cards.model`
(also ``python -m reterm.cards.model`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.cards.model import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""``python dataset_card/render.py FOLDER --repo-id ORG/NAME``: render the dataset card.

Run from the repository root; the code is :mod:`reterm.cards.dataset`
(also ``python -m reterm.cards.dataset`` from anywhere).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's reterm/ when run as a script

from reterm.cards.dataset import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

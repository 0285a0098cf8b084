"""``python -m reterm.recovery LABELLED_SET [--split NAME]``: print the classifier's per-category
precision/recall/F1 tables (markdown). See :mod:`reterm.recovery.classifier_eval`."""

import sys

from reterm.recovery.classifier_eval import main

sys.exit(main())

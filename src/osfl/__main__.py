"""``python -m osfl``: the ``osfl`` command where its script is not installed
(a lent GPU machine runs osfl from the carried source tree, docs/gpu-suite.md)."""

import sys

from osfl.cli import main

sys.exit(main())

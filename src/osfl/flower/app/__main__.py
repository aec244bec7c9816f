"""``python -m osfl.flower.app DIR``: write the osfl Flower app directory."""

import sys

from osfl.flower.app.app_dir import main

sys.exit(main())

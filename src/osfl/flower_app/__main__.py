"""``python -m osfl.flower_app DIR``: write the osfl Flower app directory."""

import sys

from osfl.flower_app.app_dir import main

sys.exit(main())

"""``python -m warpbridge`` is the ``warpbridge`` command."""

import sys

from .cli import main

sys.exit(main())

"""``python -m warpbridge`` is the ``warpbridge`` command."""

import sys

from ._cli.main import main

sys.exit(main())

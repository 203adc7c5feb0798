"""``python -m kiln``: the kiln command line."""

import sys

from .cli import main

sys.exit(main())

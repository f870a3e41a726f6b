"""`python -m recorder ...`: the same command line as `thinkaloud-recorder`."""

import sys

from .cli import main

sys.exit(main())

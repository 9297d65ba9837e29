"""`python -m yatt`: the yatt command line."""

import sys

from yatt.cli import main

sys.exit(main())

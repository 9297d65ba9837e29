"""``python -m dgcc``: the same command line as the ``dgcc`` script."""

from dgcc.cli import main

raise SystemExit(main())

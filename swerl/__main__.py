"""`python -m swerl ...`: the same as the `swerl` command."""

import sys

from swerl.cli import main

sys.exit(main())

"""`python -m swerl.cli ...` (what `torchrun -m swerl.cli` and `deepspeed --module swerl.cli` run): the
same as the `swerl` command."""

import sys

from swerl.cli import main

sys.exit(main())

"""`python -m mqcore.cli`: the same as the installed `mqcore` command."""

import sys

from mqcore.cli import main

sys.exit(main())

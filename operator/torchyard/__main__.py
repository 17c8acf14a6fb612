"""``python -m torchyard``: the command line."""

import sys

from torchyard.cli import main

sys.exit(main())

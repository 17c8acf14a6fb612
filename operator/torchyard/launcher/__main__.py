"""``python -m torchyard.launcher -- <command...>``."""

import sys

from torchyard.launcher import main

sys.exit(main())

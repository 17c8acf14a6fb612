"""``python -m torchyard.launch -- <command...>``: the launcher, where torchyard is installed."""

import sys

from torchyard.launch.main import main

sys.exit(main())

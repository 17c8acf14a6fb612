"""``python -m torchyard.envbuild ...``: the Environment builder."""

import sys

from torchyard.envbuild import main

sys.exit(main())

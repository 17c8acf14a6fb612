"""``python -m torchyard.serving``: the serving process (``server.main``)."""

import sys

from torchyard.serving.server import main

sys.exit(main())

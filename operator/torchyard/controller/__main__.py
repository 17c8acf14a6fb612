"""``python -m torchyard.controller``: run the operator (same as ``torchyard operator``)."""

from __future__ import annotations

import sys

from torchyard.cli import main

if __name__ == "__main__":
    sys.exit(main(["operator", *sys.argv[1:]]))

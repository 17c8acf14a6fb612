"""``python -m torchyard.controller``: run the operator (same as ``torchyard operator``)."""

from __future__ import annotations

import argparse
import sys

from torchyard.controller import operators, options

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m torchyard.controller")
    options.add_arguments(parser)
    sys.exit(operators.main_from_args(parser.parse_args()))

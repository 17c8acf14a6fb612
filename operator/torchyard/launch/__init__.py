"""The torchyard launcher: starts the ranks of one node and reports exactly which failed.

Standard library only, Python >= 3.8: shipped into every node Pod (``planning.shipped``) and
run by local mode. ``main`` is the entry point (``python .../torchyard/launch/main.py``, or
``python -m torchyard.launch`` where torchyard is installed); ``contract`` is the bottom,
the names and rules the operator's layers import too. This file imports nothing, so that
importing ``torchyard.launch.contract`` pulls in no other module of the launcher.
"""

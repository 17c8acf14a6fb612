"""Local mode: run a TrainingRun on this machine with exactly the cluster's rank contract.

``torchyard run FILE.yaml --local`` (through ``torchyard.sdk.local_runs``) calls
:func:`run_local`. Each of the run's ``nodeCount`` nodes becomes one launcher process (the
very launcher file an init container copies into a cluster Pod) in its own working folder;
a failing node stops the others and its termination message names the failing rank. At
the end ./outputs of node 0 and every node's ./logs are archived into a local registry
folder with the registry service's layout, and ``outputs.register`` publishes version N+1
of the model. This file is the package's face; the code lives in ``runs`` (the
processes), ``results`` (what a run did, which failure is its), ``checks`` (packages, the
register path, ONNX), ``finalize`` (archive and register) and ``sweeps`` (a Sweep's
trials, ``torchyard sweep submit FILE --local``).

Tested in ``tests/unit/local/test_mode.py`` and ``tests/e2e/``.
"""

from torchyard.local.checks import *  # noqa: F403
from torchyard.local.results import *  # noqa: F403
from torchyard.local.runs import *  # noqa: F403
from torchyard.local.sweeps import *  # noqa: F403

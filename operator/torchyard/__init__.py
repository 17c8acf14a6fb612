"""torchyard: train PyTorch models at scale on Kubernetes.

The package is layered: imports only point down, as pyproject.toml's import-linter
contracts enforce (docs/architecture.md draws the layers and a TrainingRun's path):

- ``torchyard.api``: typed, validated specs of the custom resources (pure).
- ``torchyard.planning``: pure builders of every manifest and of the rank contract.
- ``torchyard.status``: status as a pure function of a resource and its children.
- ``torchyard.registry``: the model registry's store, HTTP service and client.
- ``torchyard.k8s``: the only package that talks to the Kubernetes API.
- ``torchyard.local``: runs a TrainingRun on this machine with the same contract.
- ``torchyard.controller``: the Kopf operator (the only package that imports kopf).
- ``torchyard.registry_server``: ``torchyard registry serve``, the registry service with
  its Kubernetes authorizer.
- ``torchyard.sdk`` / ``torchyard.cli``: the user-facing Python SDK and command line.
- ``torchyard.launch``, ``torchyard.envbuild``: standard library only; the launcher (a
  package, shipped with ``checkpoint`` and ``progress`` to every node Pod) starts the
  ranks inside a training Pod, the Environment builder runs in a build Job. The other
  layers import ``torchyard.launch.contract``: every variable's name and the rules they
  share with the launcher.
- ``torchyard.metrics``: Prometheus metrics through ``prometheus_client`` (the bottom
  layer beside the launcher; it imports no other torchyard package).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

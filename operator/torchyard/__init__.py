"""torchyard: train PyTorch models at scale on Kubernetes.

The package is layered (imports only point down; see ``ARCHITECTURE.md``):

- ``torchyard.api``: typed, validated specs of the custom resources (pure).
- ``torchyard.planning``: pure builders of every manifest and of the rank contract.
- ``torchyard.status``: status as a pure function of a resource and its children.
- ``torchyard.k8s``: the only module that talks to the Kubernetes API.
- ``torchyard.controller``: the Kopf operator (the only module that imports kopf).
- ``torchyard.launcher``: standard library only; starts the ranks inside a training Pod.
- ``torchyard.local``: runs a TrainingRun on this machine with the same contract.
- ``torchyard.registry``: the model registry store and service.
- ``torchyard.sdk`` / ``torchyard.cli``: the user-facing Python SDK and command line.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

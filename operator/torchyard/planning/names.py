"""Every name torchyard gives to an object, from one place: deterministic, DNS-safe.

Called by the planners (Pods, Service), local mode and the status computations.
"""

from __future__ import annotations

LABEL_RUN = "torchyard.dev/run"
LABEL_NODE_RANK = "torchyard.dev/node-rank"
LABEL_ENVIRONMENT = "torchyard.dev/environment"
LABEL_MODEL = "torchyard.dev/model"


def service(run: str) -> str:
    """The run's headless Service: its name is the Pods' subdomain."""
    return run


def pod(run: str, node_rank: int) -> str:
    return f"{run}-{node_rank}"


def master_addr(run: str, namespace: str) -> str:
    """DNS name of node 0's Pod through the headless Service."""
    return f"{pod(run, 0)}.{service(run)}.{namespace}.svc"


def model_version(model: str, version: int) -> str:
    return f"{model}-v{version}"

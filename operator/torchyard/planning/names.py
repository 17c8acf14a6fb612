"""Every name torchyard gives to an object, from one place: deterministic, DNS-safe.

Called by the planners (Pods, Service, ModelVersions, a Sweep's trials), the controller
(finding a run's Pods and Service) and the SDK (following a run's node Pods).
"""

from __future__ import annotations

from torchyard.api import wire

# The labels (defined in torchyard.api.wire), under the names the planners use.
LABEL_RUN = wire.LABEL_RUN
LABEL_NODE_RANK = wire.LABEL_NODE_RANK
LABEL_ENVIRONMENT = wire.LABEL_ENVIRONMENT
LABEL_MODEL = wire.LABEL_MODEL
LABEL_ENDPOINT = wire.LABEL_ENDPOINT


def service(run: str) -> str:
    """The run's headless Service: its name is the Pods' subdomain."""
    return run


def pod(run: str, node_rank: int) -> str:
    return f"{run}-{node_rank}"


def workload(run: str, uid: str) -> str:
    """A run's Kueue Workload: its kind, name and the first digits of its uid (a run made
    again under the same name gets a Workload of its own, not the old one's)."""
    return f"trainingrun-{run}-{uid.replace('-', '')[:8]}" if uid else f"trainingrun-{run}"


def key_secret(run: str) -> str:
    """The Secret holding a run's key (a distribution type that ``needs_key``: mpi, whose
    name it keeps, so that the runs of earlier versions keep theirs)."""
    return f"{run}-mpi"


def master_addr(run: str, namespace: str) -> str:
    """DNS name of node 0's Pod through the headless Service."""
    return f"{pod(run, 0)}.{service(run)}.{namespace}.svc"


def model_version(model: str, version: int) -> str:
    return f"{model}-v{version}"


def checkpoints(run: str) -> str:
    """The PersistentVolumeClaim created for a run's checkpoints (spec.checkpoints.size)."""
    return f"{run}-checkpoints"


def trial(sweep: str, index: int) -> str:
    """A Sweep's trial ``index`` (a TrainingRun): the same name however often it is made."""
    return f"{sweep}-t{index}"


def sweep_trials(sweep: str) -> str:
    """The ConfigMap that holds every trial of a Sweep (``planning.sweeps.ledger``)."""
    return f"{sweep}-trials"


# The namespace's inputs cache: one claim, one index entry (a ConfigMap) and at most one
# fetch Job per cache key (the key's first 20 hex digits: 80 bits).
INPUTS_CLAIM = "torchyard-inputs"


def input_fetch(key: str) -> str:
    return f"torchyard-fetch-{key[:20]}"


def input_entry(key: str) -> str:
    return f"torchyard-input-{key[:20]}"


# An OnlineEndpoint's children: the Service (its DNS name is the scoring URI's host), the
# HorizontalPodAutoscaler and the primary Deployment (or KServe's InferenceService) share
# its name; a canary's Deployment is <name>-canary.
TRACKS = ("primary", "canary")


def endpoint_service(endpoint: str) -> str:
    return endpoint


def endpoint_deployment(endpoint: str, track: str) -> str:
    return endpoint if track == "primary" else f"{endpoint}-{track}"


def endpoint_model_input(version: int) -> str:
    """The name of an endpoint's model version as an input of the inputs cache."""
    return f"model_v{version}"

"""The names torchyard puts on the wire, defined once: API group and version, labels,
annotations, the registry token's audience and the default rendezvous port.

The lowest layer that needs them: ``planning`` (Pods, Services, ModelVersions, build
Jobs), ``status`` (reading a Pod's node rank), ``k8s`` (the REST paths of torchyard's
kinds), the API models and the SDK (snapshots, experiments) all import them from here.
The launcher and the Environment builder are standard-library files copied into images
alone, so they keep literal copies; tests/unit/api/test_wire.py checks that those copies
match.
"""

from __future__ import annotations

GROUP = "torchyard.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels of the objects torchyard makes (and of the nodes it schedules on).
LABEL_RUN = f"{GROUP}/run"
LABEL_NODE_RANK = f"{GROUP}/node-rank"
LABEL_ENVIRONMENT = f"{GROUP}/environment"
LABEL_MODEL = f"{GROUP}/model"
LABEL_POOL = f"{GROUP}/pool"
LABEL_ATTEMPT = f"{GROUP}/attempt"
# The scheduling gate a node Pod waits behind until its whole gang fits.
GANG_GATE = f"{GROUP}/gang"
# When the run was created: gangs are admitted first come, first served by it.
ANNOTATION_QUEUED_AT = f"{GROUP}/queued-at"
# A gated node Pod's spec.placement as torchyard's own gang admission reads it (the levels,
# highest first, the mode and the slice size, as JSON: ``planning.topology.Request``).
ANNOTATION_PLACEMENT = f"{GROUP}/placement"
# An admitted node Pod's: how its gang was admitted and where it went (Kueue's ClusterQueue,
# the domains of its placement by node rank); the run's Admitted condition says it.
ANNOTATION_ADMITTED = f"{GROUP}/admitted"
# An Environment build Job's: the content hash of its build inputs (hex, first 63).
LABEL_ENVIRONMENT_HASH = f"{GROUP}/environment-hash"
# A TrainingRun the Azure ML SDK's Experiment.submit made: the experiment, DNS-safe, and
# its name as the script gave it.
LABEL_EXPERIMENT = f"{GROUP}/experiment"
ANNOTATION_EXPERIMENT_NAME = f"{GROUP}/experiment-name"
# A source snapshot's ConfigMap: its sha256 (first 63 as the label), file count and size.
LABEL_SNAPSHOT = f"{GROUP}/snapshot"
ANNOTATION_SNAPSHOT_SHA256 = f"{GROUP}/sha256"
ANNOTATION_SNAPSHOT_FILES = f"{GROUP}/files"
ANNOTATION_SNAPSHOT_SIZE = f"{GROUP}/size"

# A Sweep's trial TrainingRuns: the Sweep's name and the trial's index, the parameters the
# trial got (JSON, by name), and what the Sweep decided for it (``stopped`` by the
# early-termination policy, ``canceled`` when the sweep ended first) with the reason in words.
LABEL_SWEEP = f"{GROUP}/sweep"
LABEL_TRIAL = f"{GROUP}/trial"
ANNOTATION_PARAMETERS = f"{GROUP}/parameters"
ANNOTATION_DECISION = f"{GROUP}/sweep-decision"
ANNOTATION_DECISION_REASON = f"{GROUP}/sweep-decision-reason"
# How many times ASHA promoted the trial (resumed it after a pause).
ANNOTATION_PROMOTIONS = f"{GROUP}/sweep-promotions"

# Taints the node lifecycle controller puts on a node that stopped answering: such a node
# is down for admission (planning.admission) and for a gang on it (status.exclusions),
# though every Pod tolerates them for a while (DefaultTolerationSeconds).
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})

# The audience of the ServiceAccount tokens the registry service accepts (node Pods'
# projected tokens, the operator's, the ones the CLI and SDK mint).
REGISTRY_AUDIENCE = "torchyard-registry"

# An OnlineEndpoint's children (its Deployments, Service, serving Pods) and which of its
# Deployments a Pod belongs to (``primary``: spec.model's version; ``canary``: the other
# version of spec.traffic).
LABEL_ENDPOINT = f"{GROUP}/endpoint"
LABEL_TRACK = f"{GROUP}/track"
LABEL_MODEL_VERSION = f"{GROUP}/model-version"
# A serving Pod's template: the sha256 of its source ConfigMap's content (a changed
# ConfigMap rolls the Pods, as a new model version or image does).
ANNOTATION_SOURCE_SHA256 = f"{GROUP}/source-sha256"


def endpoint_audience(namespace: str, name: str) -> str:
    """The audience a caller's token must be bound to for OnlineEndpoint ``name``: one
    per endpoint, so that neither the apiserver nor the registry nor another endpoint
    takes a token meant for this one (``kubectl create token SA --audience ...``)."""
    return f"{GROUP}/endpoints/{namespace}/{name}"


# spec.distribution.masterPort when unset, as Azure ML.
DEFAULT_MASTER_PORT = 6105

# The controller name of Kueue's MultiKueue: a TrainingRun whose spec.managedBy is this is
# dispatched by MultiKueue to a worker cluster (torchyard makes only its Workload here).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"

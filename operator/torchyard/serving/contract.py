"""The serving contract: what a serving Pod's builder (``planning.endpoints``) and the
serving runtime inside it (``torchyard.serving.server``) agree on, one copy each.

The ports and routes, the variables the runtime reads (the guide's ``AZUREML_MODEL_DIR``
beside torchyard's own), the folder the init container fills with the runtime and its
server libraries, the exit code and reason of a scoring script whose ``init()`` raised.
Standard library only: imported by ``planning`` and by the runtime in user images.
"""

from __future__ import annotations

from torchyard.launch import contract as names

# The serving container listens here (KServe's custom predictors too); the Service on 80.
PORT = 8080
SERVICE_PORT = 80
PORT_NAME = "http"

# The guide's route, the Open Inference Protocol's (KServe's V1 and V2), health, metrics.
SCORE_PATH = "/score"
V1_PREDICT = "/v1/models/{model}:predict"
V1_MODEL = "/v1/models/{model}"
V2_SERVER = "/v2"
V2_MODEL = "/v2/models/{model}"
V2_MODEL_VERSION = "/v2/models/{model}/versions/{version}"
V2_INFER = "/v2/models/{model}/infer"
V2_MODEL_READY = "/v2/models/{model}/ready"
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"
METRICS_PATH = "/metrics"
# Routes a caller needs no token for: the kubelet's probes and Prometheus' scrape.
OPEN_PATHS = frozenset({LIVE_PATH, READY_PATH, METRICS_PATH})

# The variables of the scoring process (their names are the launch contract's, where every
# variable torchyard sets is named once). AZUREML_MODEL_DIR is the guide's (the model's
# folder: os.path.join(os.getenv("AZUREML_MODEL_DIR"), "model.pt")).
MODEL_DIR = names.AZUREML_MODEL_DIR
ENTRY_SCRIPT = names.AZUREML_ENTRY_SCRIPT
MODEL_NAME = names.TORCHYARD_MODEL_NAME
MODEL_VERSION = names.TORCHYARD_MODEL_VERSION
ENDPOINT = names.TORCHYARD_ENDPOINT
NAMESPACE = names.TORCHYARD_NAMESPACE
MAX_BODY_BYTES = names.TORCHYARD_MAX_BODY_BYTES
REQUEST_TIMEOUT = names.TORCHYARD_REQUEST_TIMEOUT_SECONDS
CONCURRENCY = names.TORCHYARD_CONCURRENCY
DRAIN_SECONDS = names.TORCHYARD_DRAIN_SECONDS
ACCESS_URL = names.TORCHYARD_ENDPOINT_ACCESS_URL
REGISTRY_CA = names.TORCHYARD_REGISTRY_CA
TERMINATION_LOG = names.TORCHYARD_TERMINATION_LOG
PORT_VARIABLE = names.TORCHYARD_SERVING_PORT

# The header a token comes in through the apiserver's service proxy (which consumes
# ``Authorization``), as the registry's.
TOKEN_HEADER = "X-Torchyard-Token"

# The init container copies the runtime and its libraries here (an emptyDir, read-only in
# the serving container, first on its PYTHONPATH): ``lib/torchyard/...``, ``lib/starlette``.
RUNTIME_ROOT = "/torchyard/serving"
RUNTIME_LIB = f"{RUNTIME_ROOT}/lib"
# The distributions the runtime imports, with theirs (for Python >= 3.11): what the init
# container copies out of the torchyard image (tests/unit/serving/test_contract.py checks
# that this is the closure of starlette's, uvicorn's and prometheus_client's requirements).
LIBRARIES = (
    "starlette",
    "anyio",
    "idna",
    "typing_extensions",
    "uvicorn",
    "click",
    "h11",
    "prometheus_client",
)
# The torchyard modules the runtime imports (besides the torchyard.serving package), as
# paths under the package: the launch contract (its names, the termination message) alone
# of the launcher's (``launch/__init__.py`` imports nothing), and the metrics.
MODULES = ("launch/__init__.py", "launch/contract.py", "metrics.py")

DEFAULT_DRAIN_SECONDS = 5
# The serving Pod's init container: it fetches the model's files (checked against the
# model's manifest) and the scoring source before the runtime starts
# (``torchyard.serving.prepare``).
PREPARE_CONTAINER = "prepare"
# A scoring script whose init() raised: the process says so in the termination message
# (``reason``, the traceback's tail, the exception's class) and exits with this code.
INIT_FAILED = "InitFailed"
INIT_FAILED_EXIT = 3
# The runtime itself could not start (a library missing or too old for the Python).
RUNTIME_FAILED = "RuntimeFailed"
RUNTIME_FAILED_EXIT = 4

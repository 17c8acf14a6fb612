"""The Azure ML SDK (v1) names, a face over a module per concern: an argument does what
it does in Azure ML or raises ``TorchyardSdkError`` saying what to do instead; each
module's ``__all__`` is re-exported here."""

# ruff: noqa: I001  (the modules named on three lines: the face stays short)
from torchyard.sdk.azureml import common, compute, datasets, deployments, environments
from torchyard.sdk.azureml import experiments, hyperdrive, hyperdrive_runs, models
from torchyard.sdk.azureml import run_configs, webservices, workspaces
from torchyard.sdk.azureml.common import *  # noqa: F403
from torchyard.sdk.azureml.compute import *  # noqa: F403
from torchyard.sdk.azureml.datasets import *  # noqa: F403
from torchyard.sdk.azureml.deployments import *  # noqa: F403
from torchyard.sdk.azureml.environments import *  # noqa: F403
from torchyard.sdk.azureml.experiments import *  # noqa: F403
from torchyard.sdk.azureml.hyperdrive import *  # noqa: F403
from torchyard.sdk.azureml.hyperdrive_runs import *  # noqa: F403
from torchyard.sdk.azureml.models import *  # noqa: F403
from torchyard.sdk.azureml.run_configs import *  # noqa: F403
from torchyard.sdk.azureml.webservices import *  # noqa: F403
from torchyard.sdk.azureml.workspaces import *  # noqa: F403

__all__ = [
    *common.__all__,
    *compute.__all__,
    *datasets.__all__,
    *deployments.__all__,
    *environments.__all__,
    *experiments.__all__,
    *hyperdrive.__all__,
    *hyperdrive_runs.__all__,
    *models.__all__,
    *run_configs.__all__,
    *webservices.__all__,
    *workspaces.__all__,
]

"""The Azure ML SDK (v1) names, on torchyard: the guide "Train PyTorch models at scale"
runs with only its imports changed (``from torchyard.sdk import Workspace, ...``). This
file is the face; the code lives in a module per concern: ``workspaces`` (Workspace),
``compute`` (AmlCompute, ComputeTarget), ``environments`` (Environment), ``run_configs``
(ScriptRunConfig, PyTorchConfiguration, MpiConfiguration), ``experiments`` (Experiment,
Run), ``models`` (Run.register_model, Model) and ``common`` (the errors).

Every argument either does what it does in Azure ML or, given a value other than its
default, raises ``TorchyardSdkError`` saying what to do instead (table-tested in
tests/unit/sdk/test_azureml_arguments.py); nothing is accepted and then ignored.
Each module's ``__all__`` is what it re-exports here (tests/unit/sdk/test_azureml.py).
"""

from torchyard.sdk.azureml import (
    common,
    compute,
    environments,
    experiments,
    models,
    run_configs,
    workspaces,
)
from torchyard.sdk.azureml.common import *  # noqa: F403
from torchyard.sdk.azureml.compute import *  # noqa: F403
from torchyard.sdk.azureml.environments import *  # noqa: F403
from torchyard.sdk.azureml.experiments import *  # noqa: F403
from torchyard.sdk.azureml.models import *  # noqa: F403
from torchyard.sdk.azureml.run_configs import *  # noqa: F403
from torchyard.sdk.azureml.workspaces import *  # noqa: F403

__all__ = [
    *common.__all__,
    *compute.__all__,
    *environments.__all__,
    *experiments.__all__,
    *models.__all__,
    *run_configs.__all__,
    *workspaces.__all__,
]

# The MPI way of the Azure ML guides (SDK v1: "Distributed GPU training guide", section
# "MPI"), with ONLY its imports changed: `from azureml.core... import X` became
# `from torchyard.sdk import X`; the workspace and compute target come first as in
# train_at_scale.py. torchyard runs it as a TrainingRun of `distribution.type: mpi`:
# node 0's launcher starts OpenMPI's mpirun over both node Pods. ./src is
# examples/mpi (its train.py: mpi4py + PyTorch); the curated Environment needs OpenMPI
# and mpi4py (tests/node/test_guide.py runs this on the real test node).
# ruff: noqa: E402, I001
from torchyard.sdk import ComputeTarget, Workspace

ws = Workspace.from_config()
compute_target = ComputeTarget(workspace=ws, name="gpu-cluster")

from torchyard.sdk import Environment, Experiment, ScriptRunConfig
from torchyard.sdk import MpiConfiguration

curated_env_name = "AzureML-PyTorch-1.6-GPU"
pytorch_env = Environment.get(workspace=ws, name=curated_env_name)
distr_config = MpiConfiguration(process_count_per_node=2, node_count=2)

run_config = ScriptRunConfig(
    source_directory="./src",
    script="train.py",
    compute_target=compute_target,
    environment=pytorch_env,
    distributed_job_config=distr_config,
)

# submit the run configuration to start the job
run = Experiment(ws, "experiment_name").submit(run_config)
run.wait_for_completion(show_output=True)

# The Azure ML guide "Train PyTorch models at scale with Azure Machine Learning" (SDK v1)
# run on this machine, as Azure ML runs it with compute_target="local", with ONLY its
# imports changed: `from azureml.core... import X` became `from torchyard.sdk import X`.
# No cluster and no config.json needed: the run goes through local mode (the cluster's rank
# contract, 2 nodes x 2 processes as processes here) into the local registry
# (~/.torchyard/registry: `torchyard runs list --local`, `torchyard models list --local`).
# tests/e2e/test_guide_locally.py runs it.
# ruff: noqa: E402
from torchyard.sdk import Workspace

ws = Workspace.from_config()

from torchyard.sdk import Environment

pytorch_env = Environment.from_conda_specification(
    name="pytorch-1.6-gpu", file_path="./conda_dependencies.yml"
)

# Specify a GPU base image
pytorch_env.docker.enabled = True
pytorch_env.docker.base_image = "mcr.microsoft.com/azureml/openmpi3.1.2-cuda10.1-cudnn7-ubuntu18.04"

from torchyard.sdk import PyTorchConfiguration, ScriptRunConfig

project_folder = "./pytorch-birds"
distr_config = PyTorchConfiguration(process_count=4, node_count=2)

src = ScriptRunConfig(
    source_directory=project_folder,
    script="pytorch_train.py",
    arguments=["--num_epochs", 30, "--output_dir", "./outputs"],
    compute_target="local",
    environment=pytorch_env,
    distributed_job_config=distr_config,
)

from torchyard.sdk import Experiment

run = Experiment(ws, name="Tutorial-pytorch-birds").submit(src)
run.wait_for_completion(show_output=True)

print(run.get_metrics())

model = run.register_model(model_name="pytorch-birds", model_path="outputs/model.pt")
print(model.name, model.id, model.version, sep="\t")

run.download_file(name="outputs/model.pt", output_file_path="./model.pt")

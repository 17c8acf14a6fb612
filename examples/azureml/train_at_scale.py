# The Azure ML guide "Train PyTorch models at scale with Azure Machine Learning" (SDK v1),
# with ONLY its imports changed: `from azureml.core... import X` became
# `from torchyard.sdk import X`. Run it where .torchyard/config.json names your namespace
# (see config.json.example); tests/integration/test_azureml.py runs it against a cluster.
# ruff: noqa: E402
from torchyard.sdk import Workspace

ws = Workspace.from_config()

from torchyard.sdk import AmlCompute, ComputeTarget, ComputeTargetException

# Choose a name for your GPU cluster
cluster_name = "gpu-cluster"

# Verify that cluster does not exist already
try:
    compute_target = ComputeTarget(workspace=ws, name=cluster_name)
    print("Found existing compute target")
except ComputeTargetException:
    print("Creating a new compute target...")
    compute_config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6", max_nodes=4)

    # Create the cluster
    compute_target = ComputeTarget.create(ws, cluster_name, compute_config)

    compute_target.wait_for_completion(show_output=True, min_node_count=None, timeout_in_minutes=20)

# Use get_status() to get a detailed status for the current AmlCompute.
print(compute_target.get_status())

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
    compute_target=compute_target,
    environment=pytorch_env,
    distributed_job_config=distr_config,
)

from torchyard.sdk import Experiment

run = Experiment(ws, name="Tutorial-pytorch-birds").submit(src)
run.wait_for_completion(show_output=True)

model = run.register_model(model_name="pytorch-birds", model_path="outputs/model.pt")
print(model.name, model.id, model.version, sep="\t")

run.download_file(name="outputs/model.pt", output_file_path="./model.pt")

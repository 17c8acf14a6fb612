# The deployment part of Azure ML's notebook "train, hyperparameter tune, and deploy with
# PyTorch", with ONLY its imports changed (`from azureml.core... import X` became
# `from torchyard.sdk import X`), run after the model was registered (train_at_scale.py).
# `Model(ws, name=...)` stands for the notebook's `best_run.register_model(...)`, and the
# test image is one of the example's own birds (its network takes 32x32 images, not the
# notebook's 224x224 photos). Run it where .torchyard/config.json names your namespace,
# beside pytorch_score.py and the training script it imports (../birds);
# tests/node/test_endpoints_on_node.py runs it.
# ruff: noqa: E402
from torchyard.sdk import Environment, Model, Workspace

ws = Workspace.from_config()
model = Model(ws, name="pytorch-birds")
print(model.name, model.id, model.version, sep="\t")

pytorch_env = Environment.from_conda_specification(
    name="pytorch-1.6-gpu", file_path="./conda_dependencies.yml"
)

# Specify a GPU base image
pytorch_env.docker.enabled = True
pytorch_env.docker.base_image = "mcr.microsoft.com/azureml/openmpi3.1.2-cuda10.1-cudnn7-ubuntu18.04"

from torchyard.sdk import AciWebservice, InferenceConfig, Model

inference_config = InferenceConfig(entry_script="pytorch_score.py", environment=pytorch_env)

aciconfig = AciWebservice.deploy_configuration(
    cpu_cores=2,
    memory_gb=2,
    tags={"data": "birds", "method": "transfer learning", "framework": "pytorch"},
    description="Classify turkey/chickens using transfer learning with PyTorch",
)

service = Model.deploy(
    workspace=ws,
    name="aci-birds",
    models=[model],
    inference_config=inference_config,
    deployment_config=aciconfig,
)
service.wait_for_deployment(True)
print(service.state)

print(service.get_logs())

print(service.scoring_uri)

import json

import birds_data

images, labels = birds_data.birds(1, seed=11)  # the notebook's preprocess('test_img.jpg')
input_data = images
result = service.run(input_data=json.dumps({"data": input_data.tolist()}))
print(result)

service.delete()

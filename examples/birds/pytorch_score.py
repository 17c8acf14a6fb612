"""The scoring script of the Azure ML guide's companion notebook ("train, hyperparameter
tune, and deploy with PyTorch"), for this example's model: ``init()`` loads the model once
from ``AZUREML_MODEL_DIR`` (the registered version's files), ``run(input_data)`` classifies
the images of one request and returns JSON.

The guide's model was a whole pickled torchvision ResNet; this example saves the weights
and the class names (``pytorch_train.py``), so ``init()`` builds the network from the
training script beside it. Deploy it with ``Model.deploy`` (``examples/azureml/deploy.py``)
or an OnlineEndpoint whose ``entryScript`` is this file.
"""

import json
import os

import torch
from pytorch_train import Backbone, Classifier
from torch import nn


def init():
    global model, classes
    model_path = os.path.join(os.getenv("AZUREML_MODEL_DIR"), "model.pt")
    saved = torch.load(model_path, map_location=lambda storage, loc: storage)
    classes = saved["classes"]
    model = Classifier(Backbone(), len(classes))
    model.load_state_dict(saved["state_dict"])
    model.eval()


def run(input_data):
    input_data = torch.tensor(json.loads(input_data)["data"])

    # get prediction
    with torch.no_grad():
        output = model(input_data)
        softmax = nn.Softmax(dim=1)
        pred_probs = softmax(output).numpy()[0]
        index = int(torch.argmax(output, 1)[0])

    result = {"label": classes[index], "probability": str(pred_probs[index])}
    return result

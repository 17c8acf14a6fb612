"""The birds example on the real kubelet node, as the guide and its notebook use it: it
trains on images it reads from an ``s3://`` input (the harness's S3 store), its model is
registered, and a second run fine-tunes that ModelVersion from a ``model://`` input (the
script loads it and prints the file, its sha256 and its parameters' checksum, which are
the first run's); and a Sweep of real birds trials registers its best completed trial.

The fetch Jobs run on the node (the KWOK nodes are cordoned: a fetch Job has no node
selector); the registry service runs on this machine behind a Service of the namespace
(the ``registry`` fixture of tests/node/conftest.py). Epochs and images are few: the point is the
path of the data and the weights, not the accuracy."""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder
from tests.cluster import s3 as store_server
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address
from tests.integration.helpers import run_pods, wait_status
from tests.integration.test_registry_service import Service, trainer_token
from tests.node.runs import BIRDS, ddp_run, explain, finished, operator_with, submit
from torchyard import k8s

pytestmark = pytest.mark.node

IMAGES = 80
BIRDS_INPUT = {"name": "birds", "uri": "s3://birds/train", "secretRef": "birds-store"}
CHECKSUM = re.compile(r"param-checksum rank 0 ([0-9a-f]{64})$", re.MULTILINE)
REPORTED = re.compile(r"@@torchyard (\{.*\})$", re.MULTILINE)


@pytest.fixture
def birds_store(
    tmp_path: Path, seaweedfs: Path
) -> Iterator[tuple[store_server.Store, store_server.CountingProxy]]:
    """The store with bucket ``birds`` holding ``train/birds.npz`` (80 drawn birds, made by
    the example's own ``birds_data.save``), behind a proxy the node's Pods reach that
    records every request."""
    sys.path.insert(0, str(BIRDS))
    try:
        birds_data = importlib.import_module("birds_data")
    finally:
        sys.path.remove(str(BIRDS))
    saved = Path(birds_data.save(str(tmp_path), IMAGES))
    with store_server.running(seaweedfs) as store:
        store.bucket("birds")
        store.put("birds", "train/birds.npz", saved.read_bytes())
        host, port = store.endpoint.removeprefix("http://").split(":")
        counting = store_server.CountingProxy((host, int(port)))
        try:
            yield store, counting
        finally:
            counting.close()


def store_secret(namespace: str, store: store_server.Store, port: int) -> None:
    """The Secret ``birds-store``: the proxy's endpoint and the store's keys."""
    data = {
        "AWS_ENDPOINT_URL": f"http://{_host_address()}:{port}",
        "AWS_REGION": store.region,
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
    }
    meta = {"name": "birds-store", "namespace": namespace}
    k8s.create({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data})


def birds_trial(node: RealNode, *args: str) -> TrainingRunBuilder:
    """examples/birds as one Pod of one process on the real node, as ServiceAccount
    ``trainer`` (the registry's reader and the archive's writer)."""
    return (
        ddp_run("birds", "", node)
        .command("python", "pytorch_train.py", "--output_dir", "./outputs", *args)
        .nodes(1)
        .procs(1)
        .with_("spec.serviceAccountName", "trainer")
    )


def birds_run(
    name: str, ns: str, node: RealNode, inputs: list[dict[str, Any]], *args: str
) -> dict[str, Any]:
    body = birds_trial(node, *args).register("birds", path="outputs").obj()
    body["metadata"] = {"name": name, "namespace": ns}
    body["spec"]["inputs"] = inputs
    return body


def trainer_log(cluster: Cluster, namespace: str, run: str) -> str:
    [pod] = run_pods(namespace, run)
    return cluster.kubectl("logs", pod["metadata"]["name"], "-n", namespace, "-c", "trainer")


def test_the_birds_example_trains_from_s3_and_fine_tunes_its_model_from_a_model_input(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    cache_class: str,
    only_real_node: RealNode,  # (the fetch Job has no node selector)
    birds_store: tuple[store_server.Store, store_server.CountingProxy],
    tmp_path: Path,
) -> None:
    ns = env
    _, url, _ = registry
    store, counting = birds_store
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(ns))  # ServiceAccount trainer: modelversions
    store_secret(ns, store, counting.port)
    data = "$TORCHYARD_INPUT_BIRDS"
    first = birds_run(
        "birds", ns, real_node, [BIRDS_INPUT],
        "--pretrain_epochs", "1", "--num_epochs", "1", "--data_dir", data,
    )  # fmt: skip
    base = {"name": "base", "uri": "model://birds/1"}
    tuned = birds_run(
        "tuned", ns, real_node, [BIRDS_INPUT, base],
        "--num_epochs", "1", "--data_dir", data, "--init_model", "$TORCHYARD_INPUT_BASE",
    )  # fmt: skip
    with operator_with(
        operator,
        TORCHYARD_REGISTRY_URL=url,
        TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file),
        TORCHYARD_INPUTS_STORAGE_CLASS=cache_class,
        TORCHYARD_INPUTS_CACHE_SIZE="1Gi",  # the volume's 2Gi hold it
    ):
        started = time.monotonic()
        submit(cluster, tmp_path, first, source=BIRDS)
        trained = finished(ns, "birds", timeout=300)
        assert trained["status"]["phase"] == "Succeeded", explain(cluster, ns, "birds")
        asked = list(counting.served)
        submit(cluster, tmp_path, tuned, source=BIRDS)
        again = finished(ns, "tuned", timeout=300)
        assert again["status"]["phase"] == "Succeeded", explain(cluster, ns, "tuned")
    took = time.monotonic() - started
    print(f"\n[node] birds from s3://, then fine-tuned from model:// in {took:.1f}s")

    # 1. trained on the store's images, through the input; registered as birds 1
    [got] = trained["status"]["inputs"]
    size = len((tmp_path / "birds.npz").read_bytes())
    assert (got["uri"], got["bytes"], got["fetchedBytes"]) == ("s3://birds/train", size, size)
    assert trained["status"]["model"] == {"name": "birds", "version": 1}
    log = trainer_log(cluster, ns, "birds")
    assert f"read {IMAGES} bird images from /torchyard/inputs/birds" in log, log
    [trained_checksum] = CHECKSUM.findall(log)
    files = {f["path"]: f for f in k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")["spec"]["files"]}
    weights = files["model.pt"]["sha256"]

    # 2. fine-tuned from that version: the file it loaded is the registered one, with the
    # parameters the first run ended with; no pre-training; the images from the cache
    inputs = {i["name"]: i for i in again["status"]["inputs"]}
    assert (inputs["base"]["uri"], inputs["base"]["revision"]) == ("model://birds/1", "1")
    assert inputs["base"]["bytes"] == sum(f["size"] for f in files.values())
    assert inputs["birds"]["fetchedBytes"] == 0
    assert inputs["birds"]["digest"] == got["digest"]
    assert counting.served == asked, "the second run asked the store nothing"
    log = trainer_log(cluster, ns, "tuned")
    loaded = f"loaded /torchyard/inputs/base/model.pt sha256 {weights}"
    assert f"{loaded} param-checksum {trained_checksum}" in log, log
    assert "pretrain epoch" not in log and "finetune epoch 1/1" in log, log
    [tuned_checksum] = CHECKSUM.findall(log)
    assert tuned_checksum != trained_checksum, "fine-tuning changed the weights"
    assert again["status"]["model"] == {"name": "birds", "version": 2}
    assert k8s.get(k8s.MODELVERSIONS, ns, "birds-v2")["spec"]["run"]["name"] == "tuned"


# -- a sweep -----------------------------------------------------------------------------


def ledger(namespace: str, sweep: str) -> dict[int, dict[str, Any]]:
    data = k8s.get(k8s.CONFIGMAPS, namespace, f"{sweep}-trials").get("data") or {}
    return {int(key.removeprefix("t")): json.loads(text) for key, text in data.items()}


def reported(cluster: Cluster, namespace: str, trial: str, metric: str) -> list[float]:
    """The values of ``metric`` the trial's script printed in its progress lines."""
    lines = REPORTED.findall(trainer_log(cluster, namespace, trial))
    return [json.loads(line)[metric] for line in lines]


def test_a_birds_sweep_registers_its_best_completed_trial_as_a_model_version(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    tmp_path: Path,
) -> None:
    """Four trials, two at a time, Bandit, the notebook's search space; the objective is
    the training loss (minimized): a continuous value, so that one trial is the best."""
    ns = env
    _, url, _ = registry
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(ns))
    cluster.kubectl("create", "configmap", "birds-src", f"--from-file={BIRDS}", "-n", ns)
    trial = birds_trial(real_node, "--pretrain_epochs", "1", "--num_epochs", "2")
    trial = trial.with_("spec.command", [*trial.obj()["spec"]["command"], "--images", "80"])
    sweep = (
        SweepBuilder("tune", ns)
        .trial(trial.source(configMap="birds-src"))
        .trials(4, 2)
        .seed(2026)
        .objective("loss", "minimize")
        .bandit(0.15, 1, 1)
        .register_best("birds", path="outputs")
        .obj()
    )
    with operator_with(
        operator, TORCHYARD_REGISTRY_URL=url, TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file)
    ):
        started = time.monotonic()
        k8s.create(sweep)
        swept = wait_status(
            k8s.SWEEPS,
            ns,
            "tune",
            lambda s: s.get("phase") == "Failed" or "model" in s,
            timeout=420,
        )
    elapsed = time.monotonic() - started
    assert swept["status"]["phase"] == "Succeeded", json.dumps(swept["status"], indent=1)

    trials = ledger(ns, "tune")
    assert sorted(trials) == [0, 1, 2, 3]
    completed = {
        i: min(v for _, v in t["history"]) for i, t in trials.items() if t["state"] == "Completed"
    }
    assert completed, trials
    best = min(completed, key=lambda i: (completed[i], i))  # the lower index on a tie
    name = f"tune-t{best}"
    states = ", ".join(f"t{i} {t['state']}" for i, t in sorted(trials.items()))
    said = f"{name} registered (loss {completed[best]:.4f})"
    print(f"\n[node] birds sweep in {elapsed:.1f}s: {states}; {said}")
    assert swept["status"]["model"] == {"name": "birds", "version": 1, "trial": name}
    # the losses the Sweep ranked by are the ones the trials' scripts printed
    for index in completed:
        printed = reported(cluster, ns, f"tune-t{index}", "loss")
        assert {v for _, v in trials[index]["history"]} <= set(printed), (index, printed)
    mv = k8s.get(k8s.MODELVERSIONS, ns, "birds-v1")
    assert mv["spec"]["run"]["name"] == name
    assert mv["spec"]["run"]["uid"] == k8s.get(k8s.TRAININGRUNS, ns, name)["metadata"]["uid"]
    assert mv["spec"]["metrics"]["loss_final"] == reported(cluster, ns, name, "loss")[-1]

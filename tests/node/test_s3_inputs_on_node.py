"""s3:// inputs on the real kubelet node, read from the harness's SeaweedFS store through
a :class:`~tests.cluster.s3.CountingProxy` that records every request.

A fetch Pod whose Secret is missing, or lacks a credential, is held back by the kubelet
(CreateContainerConfigError): the run stays Preparing and says which input, which Secret
and the fix. A fetch Pod deleted half way (one object whole, the other held by the store
half way) is replaced by its Job; the new Pod fetches only what is left: the whole
object not again, the other with a Range from where the first Pod stopped, and the run
trains on both. A second run of the same input fetches nothing and asks the store
nothing: no listing, no GET."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster import s3 as store_server
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address
from tests.integration.helpers import conditions, run_pods, wait_for, wait_status
from tests.node.runs import RESOURCES, explain, finished, operator_with, submit
from torchyard import api, k8s
from torchyard.inputs import s3
from torchyard.planning import inputs, names

pytestmark = pytest.mark.node

WHOLE = os.urandom(64 << 10)  # fetched whole before the first Pod is deleted
HELD = os.urandom(4 << 20)  # held by the store after its first two MiB
HOLD_AFTER = (2 << 20) + 4096  # the answer's head and two of the fetcher's 1 MiB reads
TRAIN = """\
import hashlib, os, sys
import torch
root = sys.argv[1]
names = sorted(os.listdir(root))
data = b"".join(open(os.path.join(root, n), "rb").read() for n in names)
x = torch.tensor(list(data[:4096]), dtype=torch.float32).reshape(-1, 16) / 255
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained on", names, hashlib.sha256(data).hexdigest())
"""


@pytest.fixture
def proxy(seaweedfs: Path) -> Iterator[tuple[store_server.Store, store_server.CountingProxy]]:
    """The store with bucket ``shots`` (train/a.bin, train/b.bin), behind a proxy that
    holds b.bin's answer half way until the test releases it."""
    with store_server.running(seaweedfs) as store:
        store.bucket("shots")
        store.put("shots", "train/a.bin", WHOLE)
        store.put("shots", "train/b.bin", HELD)
        host, port = store.endpoint.removeprefix("http://").split(":")
        counting = store_server.CountingProxy(
            (host, int(port)), hold_key="train/b.bin", hold_after=HOLD_AFTER
        )
        try:
            yield store, counting
        finally:
            counting.close()


def secret(namespace: str, name: str, data: dict[str, str]) -> None:
    meta = {"name": name, "namespace": namespace}
    k8s.create({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data})


def shots_run(name: str, namespace: str, node: RealNode, store_secret: str) -> dict[str, Any]:
    shots = {"name": "shots", "uri": "s3://shots/train", "secretRef": store_secret}
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "train.py", "$TORCHYARD_INPUT_SHOTS")
        .nodes(1)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
        .with_("spec.inputs", [shots])
        .obj()
    )


def held_back(namespace: str, run: str) -> dict[str, Any]:
    """The run's InputsReady condition once it says the kubelet holds its fetch back."""
    try:
        waiting = wait_status(
            k8s.TRAININGRUNS,
            namespace,
            run,
            lambda s: (
                (conditions({"status": s}).get("InputsReady") or {}).get("reason")
                == "InputSecretNotReady"
            ),
            timeout=120,
        )
    except AssertionError as err:
        selector = f"app.kubernetes.io/component={inputs.COMPONENT_FETCH}"
        seen = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status"))
            for p in k8s.list_(k8s.PODS, namespace, label_selector=selector)
        ]
        raise AssertionError(f"{err}\nthe fetch Pods: {json.dumps(seen, indent=1)}") from None
    assert waiting["status"]["phase"] == "Preparing"
    assert run_pods(namespace, run) == []
    return conditions(waiting)["InputsReady"]


def fetch_pods(namespace: str, job: str) -> list[dict[str, Any]]:
    return k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={job}")


def done_keys(cache_folder: Path, key: str) -> set[str]:
    """The objects the fetch recorded as whole (its resume file), read off the host."""
    try:
        return set(json.loads((cache_folder / "partial" / key / s3.DONE).read_text()))
    except (OSError, ValueError):
        return set()


def part_bytes(cache_folder: Path, key: str, object_key: str) -> int:
    """What the fetch has written of an object it is fetching, read off the host."""
    part = (
        cache_folder / "partial" / key / s3.PARTS / hashlib.sha256(object_key.encode()).hexdigest()
    )
    return part.stat().st_size if part.is_file() else 0


def test_an_s3_fetch_waits_for_its_secret_resumes_when_killed_and_is_fetched_once(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    cache_class: str,
    only_real_node: RealNode,  # (the fetch Job has no node selector)
    proxy: tuple[store_server.Store, store_server.CountingProxy],
    tmp_path: Path,
) -> None:
    ns = env
    store, counting = proxy
    source = tmp_path / "source"
    source.mkdir()
    (source / "train.py").write_text(TRAIN)
    endpoint = f"http://{_host_address()}:{counting.port}"
    keys = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": store.region}
    secret(ns, "half-store", {**keys, "AWS_ACCESS_KEY_ID": store.access_key})
    secret(
        ns,
        "shots-store",
        {**keys, "AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": store.secret_key},
    )
    first = shots_run("shots", ns, real_node, "shots-store")
    key = inputs.keys(api.parse_trainingrun(first))["shots"]
    cache_folder = Path("/tmp") / cache_class
    with operator_with(
        operator,
        TORCHYARD_INPUTS_STORAGE_CLASS=cache_class,
        TORCHYARD_INPUTS_CACHE_SIZE="1Gi",  # the volume's 2Gi hold it
    ):
        # The kubelet holds back a fetch whose Secret, or a credential of it, is missing.
        submit(cluster, tmp_path, shots_run("missing", ns, real_node, "no-such-store"), source)
        submit(cluster, tmp_path, shots_run("half", ns, real_node, "half-store"), source)
        missing = held_back(ns, "missing")["message"]
        assert (
            missing.startswith("input shots: s3://shots/train: the fetch Pod torchyard-fetch-")
            and "(CreateContainerConfigError: " in missing
        ), missing
        assert 'secret "no-such-store" not found' in missing, missing
        assert f"kubectl create secret generic no-such-store -n {ns}" in missing, missing
        half = held_back(ns, "half")["message"]
        assert "AWS_SECRET_ACCESS_KEY" in half.split("(CreateContainerConfigError: ")[1], half
        assert "half-store" in half, half
        assert counting.served == [], "a fetch held back asks the store nothing"

        # A fetch Pod deleted once one object is whole and the other half way.
        submit(cluster, tmp_path, first, source)
        job = names.input_fetch(key)
        [pod] = wait_for("the fetch Pod", lambda: fetch_pods(ns, job), timeout=120)
        wait_for(
            "a.bin whole and a MiB of b.bin written",
            lambda: (
                done_keys(cache_folder, key) == {"train/a.bin"}
                and part_bytes(cache_folder, key, "train/b.bin") >= 1 << 20
            ),
            timeout=120,
        )
        k8s.delete(k8s.PODS, ns, pod["metadata"]["name"])
        wait_for(
            "the deleted fetch Pod gone",
            lambda: k8s.get_or_none(k8s.PODS, ns, pod["metadata"]["name"]) is None,
            timeout=120,
        )
        counting.release()
        trained = finished(ns, "shots", timeout=300)
        assert trained["status"]["phase"] == "Succeeded", explain(cluster, ns, "shots")

        # The same input again: ready from the cache without a request to the store.
        asked = list(counting.served)
        submit(cluster, tmp_path, shots_run("again", ns, real_node, "shots-store"), source)
        again = finished(ns, "again", timeout=300)
        assert again["status"]["phase"] == "Succeeded", explain(cluster, ns, "again")

    [whole] = counting.gets("train/a.bin")
    assert whole.range == "" and whole.finished, "a.bin fetched once, by the first Pod"
    cut, resumed = counting.gets("train/b.bin")
    assert cut.range == ""
    assert resumed.range.startswith("bytes=") and resumed.range.endswith("-")
    kept = int(resumed.range.removeprefix("bytes=").removesuffix("-"))
    assert 1 << 20 <= kept < len(HELD) and resumed.finished
    assert counting.listings() == 2, "one listing per fetch Pod"
    [got] = trained["status"]["inputs"]
    assert got["bytes"] == len(WHOLE) + len(HELD)
    assert got["fetchedBytes"] == len(HELD) - kept, "the second Pod fetched only the rest"
    job_status = k8s.get(k8s.JOBS, ns, job)["status"]
    assert (job_status.get("failed"), job_status.get("succeeded")) == (1, 1)
    digest = hashlib.sha256(WHOLE + HELD).hexdigest()
    for run in ("shots", "again"):
        log = cluster.kubectl("logs", run_pods(ns, run)[0]["metadata"]["name"], "-n", ns)
        assert f"trained on ['a.bin', 'b.bin'] {digest}" in log, log

    assert counting.served == asked, "the second run asked the store nothing"
    assert again["status"]["inputs"][0]["fetchedBytes"] == 0
    assert again["status"]["inputs"][0]["digest"] == got["digest"]

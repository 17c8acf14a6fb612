"""OnlineEndpoints on the REAL node: the birds example trained and registered by
TrainingRuns, deployed with the guide's ``pytorch_score.py``, and a bird image scored
through the endpoint's Service (kube-proxy's ClusterIP) with the label and probability the
model gives offline; a rollout from one version to the next under a steady stream of
requests from a bounded client loses none; the notebook's SDK flow
(``examples/azureml/deploy.py``, only its imports changed) deploys, calls and deletes; a
hostile caller gets 413, 400, 504 (the Pod still serving others), 401 and 403 (a token of
another namespace); a scoring script whose ``init()`` raises fails the endpoint with its
class and traceback. Everything goes through what a user touches: the OnlineEndpoint, the
Service, the SDK, the CLI; every serving Pod ran on the real node in the CPU PyTorch image,
with the serving runtime the init container copied from the torchyard image.
"""

from __future__ import annotations

import http.client
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, role_binding
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.cluster.registry import OciRegistry, push_archive
from tests.conftest import InProcessOperator
from tests.integration.helpers import wait_for, wait_status
from tests.integration.test_registry_service import Service, trainer_token
from tests.node import test_guide as guide
from tests.node.runs import BIRDS, RESOURCES, explain, finished, operator_with, submit
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.planning import environments, names
from torchyard.sdk import snapshots

pytestmark = pytest.mark.node

REPO = Path(__file__).resolve().parents[2]
SCORING = {"cpu": "500m", "memory": "1Gi"}


@dataclass
class Serving:
    """The namespace set up for serving: its registry service, the trainer's tokens."""

    ns: str
    svc: Service
    url: str
    ref: str
    node: RealNode
    cluster: Cluster
    versions: dict[str, int] = field(default_factory=dict)  # training run -> model version

    def token(self, endpoint: str, account: str = "trainer", ns: str | None = None) -> str:
        audience = wire.endpoint_audience(self.ns, endpoint)
        return k8s.request_token(ns or self.ns, account, [audience])


def may_call(namespace: str, account: str, account_ns: str | None = None) -> None:
    """ServiceAccount ``account`` may get (so call) every endpoint of ``namespace``."""
    rule = {"apiGroups": [api.GROUP], "resources": ["onlineendpoints"], "verbs": ["get"]}
    name = f"call-{account}"
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [rule],
        }
    )
    binding = role_binding(namespace, name, name, account)
    binding["subjects"][0]["namespace"] = account_ns or namespace
    k8s.create(binding)


@pytest.fixture
def serving(
    cluster: Cluster,
    env: str,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    cache_class: str,
    only_real_node: RealNode,  # (fetch Jobs have no node selector)
    tmp_path: Path,
) -> Iterator[Serving]:
    """The operator with the registry service (archives, the model fetch, callers'
    tokens), the namespace's inputs cache, and the torchyard image as its init image."""
    svc, url, ref = registry
    token_file = tmp_path / "operator-token"
    token_file.write_text(trainer_token(env))  # ServiceAccount trainer: get/create models
    may_call(env, "trainer")
    with operator_with(
        operator,
        TORCHYARD_REGISTRY_URL=url,
        TORCHYARD_REGISTRY_TOKEN_FILE=str(token_file),
        TORCHYARD_INPUTS_STORAGE_CLASS=cache_class,
        TORCHYARD_INPUTS_CACHE_SIZE="1Gi",
    ):
        yield Serving(env, svc, url, ref, only_real_node, cluster)


def train(serving: Serving, tmp_path: Path, epochs: dict[str, int]) -> None:
    """A small birds run per entry (its fine-tuning epochs), at once; each registers the
    next version of model pytorch-birds (``serving.versions``)."""
    for name, count in epochs.items():
        body = (
            TrainingRunBuilder(name, serving.ns)
            .environment("pytorch")
            .command(
                "python",
                "pytorch_train.py",
                "--num_epochs",
                str(count),
                "--pretrain_epochs",
                "1",
                "--images",
                "80",
                "--output_dir",
                "./outputs",
            )
            .nodes(1)
            .procs(1)
            .pool(serving.node.pool)
            .with_("spec.resources", dict(RESOURCES))
            .with_("spec.runAsUser", 1000)
            .with_("spec.serviceAccountName", "trainer")
            .register("pytorch-birds", path="outputs/model.pt")
            .obj()
        )
        submit(serving.cluster, tmp_path, body, source=BIRDS)
    for name in epochs:
        run = finished(serving.ns, name, timeout=300)
        assert run["status"]["phase"] == "Succeeded", explain(serving.cluster, serving.ns, name)
        serving.versions[name] = int(run["status"]["model"]["version"])


def source_of(folder: Path, ns: str) -> dict[str, str]:
    """The scoring code as the SDK sends it: a snapshot of ``folder`` (a ConfigMap)."""
    snap = snapshots.snapshot(folder)
    try:
        snapshots.store(snap, ns, lambda: pytest.fail("no registry needed for a small folder"))
        return dict(snap.source)
    finally:
        snap.close()


def endpoint(
    serving: Serving, name: str, version: int, source: dict[str, str], entry: str, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "OnlineEndpoint",
        "metadata": {"name": name, "namespace": serving.ns},
        "spec": {
            "model": {"uri": f"model://pytorch-birds/{version}"},
            "environment": "pytorch",
            "source": source,
            "entryScript": entry,
            "compute": {"pool": serving.node.pool},
            "resources": dict(SCORING),
            "serviceAccountName": "trainer",
            **spec,
        },
    }


def describe(serving: Serving, name: str) -> str:
    return "\n".join(
        [
            serving.cluster.kubectl("get", "oe", name, "-n", serving.ns, "-o", "yaml", check=False),
            serving.cluster.kubectl("get", "pods", "-n", serving.ns, "-o", "wide", check=False),
            serving.cluster.kubectl("get", "events", "-n", serving.ns, check=False)[-4000:],
            serving.cluster.kubectl(
                "logs", "-n", serving.ns, "-l", f"{names.LABEL_ENDPOINT}={name}",
                "--all-containers", "--tail", "60", check=False,
            ),
        ]
    )  # fmt: skip


def ready(serving: Serving, name: str, timeout: float = 180) -> dict[str, Any]:
    """The endpoint's object once it is Ready and its Service takes connections here.

    Ready says its Pods are ready; kube-proxy programs the Service's ClusterIP a moment
    after the EndpointSlice names them (seconds in a loaded suite, when a connection is
    refused), so the first request waits for that as a client of any Service would."""
    try:
        found = wait_status(
            k8s.ONLINEENDPOINTS, serving.ns, name, lambda s: s.get("phase") == "Ready", timeout
        )
    except AssertionError:
        raise AssertionError(describe(serving, name)) from None
    ip = k8s.get(k8s.SERVICES, serving.ns, name)["spec"]["clusterIP"]
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((ip, 80), timeout=10).close()
            return found
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} is Ready but its Service {ip}:80 refused connections for 60 s:\n"
                    + describe(serving, name)
                ) from None
            time.sleep(0.5)


def on_the_real_node(serving: Serving, name: str) -> list[dict[str, Any]]:
    pods = k8s.list_(k8s.PODS, serving.ns, label_selector=f"{names.LABEL_ENDPOINT}={name}")
    assert pods, f"no serving Pod of {name}"
    for pod in pods:
        assert pod["spec"]["nodeName"] == serving.node.name, pod["metadata"]["name"]
    return pods


class Client:
    """HTTP to an endpoint's Service from this machine (kube-proxy routes the ClusterIP),
    one kept-alive connection, opened again whenever the server says ``close``."""

    def __init__(self, ns: str, service: str, token: str = "") -> None:
        self.ip = k8s.get(k8s.SERVICES, ns, service)["spec"]["clusterIP"]
        self.token = token
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, **headers: str) -> tuple[int, Any, dict[str, str]]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.ip, 80, timeout=30)
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.conn.request("POST", path, body=body, headers={**auth, **headers})
        response = self.conn.getresponse()
        data = response.read()
        said = {k.lower(): v for k, v in response.getheaders()}
        if said.get("connection") == "close":
            self.conn.close()
            self.conn = None
        try:
            return response.status, json.loads(data), said
        except ValueError:
            return response.status, data.decode("utf-8", "replace"), said

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def bird_image() -> tuple[list[Any], Any]:
    """One bird of the example's (as the request's ``data``), and the array."""
    sys.path.insert(0, str(BIRDS))
    try:
        birds_data = importlib.import_module("birds_data")
    finally:
        sys.path.remove(str(BIRDS))
    images, _ = birds_data.birds(1, seed=11)
    return images.tolist(), images


def offline(model_file: Path, images: Any) -> tuple[str, float]:
    """The label and probability the model gives here, with this machine's torch."""
    import torch

    sys.path.insert(0, str(BIRDS))
    try:
        train_module = importlib.import_module("pytorch_train")
    finally:
        sys.path.remove(str(BIRDS))
    saved = torch.load(model_file, map_location="cpu")
    model = train_module.Classifier(train_module.Backbone(), len(saved["classes"]))
    model.load_state_dict(saved["state_dict"])
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(torch.from_numpy(images)), dim=1)[0]
    index = int(probs.argmax())
    return saved["classes"][index], float(probs[index])


def model_file(serving: Serving, version: int) -> Path:
    return serving.svc.root / serving.ns / "models" / "pytorch-birds" / str(version) / "model.pt"


def test_birds_served_as_trained_and_rolled_to_a_new_version_without_a_lost_request(
    serving: Serving, tmp_path: Path
) -> None:
    train(serving, tmp_path, {"birds-one": 1, "birds-two": 3})
    v1, v2 = serving.versions["birds-one"], serving.versions["birds-two"]
    data, images = bird_image()
    request = json.dumps({"data": data}).encode()
    expected = {v: offline(model_file(serving, v), images) for v in (v1, v2)}
    assert expected[v1][1] != expected[v2][1], "the two versions answer alike"

    source = source_of(BIRDS, serving.ns)
    started = time.monotonic()
    k8s.apply(endpoint(serving, "birds", v1, source, "pytorch_score.py"), field_manager="test")
    st = ready(serving, "birds")["status"]
    deploy_s = time.monotonic() - started
    print(f"\n[node] endpoint birds: created -> Ready in {deploy_s:.1f}s (model fetched)")
    pods = on_the_real_node(serving, "birds")
    scorer = next(c for c in pods[0]["status"]["containerStatuses"] if c["name"] == "scorer")
    assert scorer["image"].endswith(serving.node.images["pytorch"].ref.split("/", 1)[1])
    assert st["scoringUri"] == f"http://birds.{serving.ns}.svc/score"
    entry = st["inputs"][0]
    assert entry["uri"] == f"model://pytorch-birds/{v1}" and entry["fetchedBytes"] > 0

    client = Client(serving.ns, "birds", serving.token("birds"))
    status, answer, _ = client.post("/score", request, **{"Content-Type": "application/json"})
    assert status == 200, answer
    label, probability = expected[v1]
    assert answer["label"] == label
    assert abs(float(answer["probability"]) - probability) < 1e-4, (answer, probability)
    # the Open Inference Protocol's routes run the same run()
    v2_request = {"inputs": [{"name": "data", "shape": list(images.shape), "datatype": "FP32",
                              "data": images.flatten().tolist()}]}  # fmt: skip
    status, answer, _ = client.post(
        "/v2/models/pytorch-birds/infer", json.dumps(v2_request).encode()
    )
    assert status == 200 and answer["outputs"][0]["data"] == [label], answer
    status, answer, _ = client.post(
        "/v1/models/pytorch-birds:predict", json.dumps({"instances": data}).encode()
    )
    assert status == 200 and answer["predictions"][0]["label"] == label, answer

    to_v2 = endpoint(serving, "birds", v2, source, "pytorch_score.py")
    answers = roll_under_load(serving, client, request, to_v2, v2)
    client.close()
    assert answers.failures == [], answers.failures[:5]
    seen = [a for a in answers.probabilities]
    first, last = expected[v1][1], expected[v2][1]
    assert all(abs(p - first) < 1e-4 or abs(p - last) < 1e-4 for p in seen), (
        "an answer of neither version"
    )
    switched = next(i for i, p in enumerate(seen) if abs(p - last) < 1e-4)
    assert abs(seen[0] - first) < 1e-4 and all(abs(p - last) < 1e-4 for p in seen[-20:])
    print(
        f"[node] rollout v{v1} -> v{v2} under load: {len(seen)} requests, 0 failed, first "
        f"answer of v{v2} at request {switched}, rollout {answers.seconds:.1f}s"
    )
    assert {
        p["metadata"]["labels"][wire.LABEL_MODEL_VERSION]
        for p in on_the_real_node(serving, "birds")
    } == {str(v2)}


@dataclass
class Answers:
    probabilities: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def roll_under_load(
    serving: Serving,
    client: Client,
    request: bytes,
    updated: dict[str, Any],
    version: int,
    most: int = 4000,
) -> Answers:
    """Requests one after another (at most ``most``, for at most 240 s) while the endpoint
    is applied as ``updated`` and rolls to ``version``; stops 5 s after every Pod serves it."""
    answers = Answers()
    stop = threading.Event()

    def load() -> None:
        for _ in range(most):
            if stop.is_set():
                return
            try:
                status, answer, _ = client.post("/score", request)
            except (OSError, http.client.HTTPException) as err:
                answers.failures.append(f"{type(err).__name__}: {err}")
                client.conn = None
                continue
            if status != 200:
                answers.failures.append(f"{status}: {answer}")
                continue
            answers.probabilities.append(float(answer["probability"]))
            time.sleep(0.02)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(3)  # the old version answers first
    started = time.monotonic()
    k8s.apply(updated, field_manager="test")

    def rolled() -> bool:
        st = k8s.get(k8s.ONLINEENDPOINTS, serving.ns, "birds").get("status") or {}
        return st.get("phase") == "Ready" and (st.get("model") or {}).get("version") == version

    try:
        wait_for("the rollout", rolled, timeout=200)
        answers.seconds = time.monotonic() - started
        wait_for(
            "the old Pod gone",
            lambda: all(
                p["metadata"]["labels"][wire.LABEL_MODEL_VERSION] == str(version)
                for p in k8s.list_(
                    k8s.PODS, serving.ns, label_selector=f"{names.LABEL_ENDPOINT}=birds"
                )
            ),
            timeout=60,
        )
        time.sleep(5)
    finally:
        stop.set()
        thread.join(60)
    return answers


HOSTILE_SCRIPT = """
import json, os, time

def init():
    global ready_at
    ready_at = time.time()

def run(raw_data):
    data = json.loads(raw_data)
    if data.get("hang"):
        time.sleep(600)
    return {"ok": True, "model_dir": os.path.basename(os.environ["AZUREML_MODEL_DIR"])}
"""
BROKEN_SCRIPT = """
import os

def init():
    path = os.path.join(os.getenv("AZUREML_MODEL_DIR"), "weights.bin")
    open(path).read()

def run(raw_data):
    return {}
"""


def test_hostile_callers_are_refused_and_a_failing_init_names_its_error(
    serving: Serving, cluster: Cluster, tmp_path: Path
) -> None:
    # a model version of its own (no training needed): one small file in the registry
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "model.json").write_text('{"w": 1}')
    from torchyard.registry import Store

    Store(serving.svc.root).publish(serving.ns, "pytorch-birds", folder)
    code = tmp_path / "code"
    code.mkdir()
    (code / "score.py").write_text(HOSTILE_SCRIPT)
    (code / "broken.py").write_text(BROKEN_SCRIPT)
    source = source_of(code, serving.ns)
    limits = {"maxBodyBytes": 4096, "requestTimeoutSeconds": 2, "concurrency": 2}
    k8s.apply(
        endpoint(serving, "hostile", 1, source, "score.py", limits=limits), field_manager="test"
    )
    k8s.apply(endpoint(serving, "broken", 1, source, "broken.py"), field_manager="test")
    ready(serving, "hostile")
    on_the_real_node(serving, "hostile")
    client = Client(serving.ns, "hostile", serving.token("hostile"))
    assert client.post("/score", b'{"x": 1}')[0] == 200
    status, answer, _ = client.post("/score", b'{"x": "' + b"a" * 8000 + b'"}')
    assert status == 413 and "limit of 4096 bytes" in answer["error"], answer
    status, answer, _ = client.post("/score", b'{"x": [1, 2')
    assert status == 400 and "not JSON" in answer["error"], answer
    started = time.monotonic()
    status, answer, _ = client.post("/score", b'{"hang": true}')
    assert status == 504 and time.monotonic() - started < 10, answer
    # the Pod stays ready and serves others on its other thread
    pod = on_the_real_node(serving, "hostile")[0]
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert client.post("/score", b'{"x": 2}')[0] == 200
    client.close()
    # callers: none, another namespace's token, a token for the registry's audience
    other = cluster.create_namespace(f"{serving.ns[:50]}-x")
    try:
        wait_for(
            "the default ServiceAccount",
            lambda: k8s.get_or_none(k8s.SERVICEACCOUNTS, other, "default"),
        )
        elsewhere = k8s.request_token(
            other, "default", [wire.endpoint_audience(serving.ns, "hostile")]
        )
        for token, expected in (
            ("", 401),
            (elsewhere, 403),
            (k8s.request_token(serving.ns, "trainer", [wire.REGISTRY_AUDIENCE]), 401),
            (serving.token("broken"), 401),  # another endpoint's token
        ):
            status, answer, _ = Client(serving.ns, "hostile", token).post("/score", b'{"x": 3}')
            assert status == expected, (expected, answer)
    finally:
        cluster.delete_namespace(other)

    failed = wait_status(
        k8s.ONLINEENDPOINTS, serving.ns, "broken", lambda s: s.get("phase") == "Failed", timeout=120
    )["status"]
    failure = failed["failure"]
    assert failure["reason"] == "InitFailed" and failure["exception"] == "FileNotFoundError"
    assert failure["class"] == "PythonException", failure
    assert 'broken.py", line 6, in init' in failure["message"], failure
    assert failure["message"].endswith("weights.bin'"), failure
    assert "CrashLoopBackOff" not in failed["message"]
    logs = subprocess.run(
        [sys.executable, "-m", "torchyard", "endpoints", "logs", "broken", "-n", serving.ns],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "FileNotFoundError" in logs.stdout, logs.stdout + logs.stderr


def test_the_notebooks_deploy_section_runs_with_only_its_imports_changed(
    serving: Serving, oci_registry: OciRegistry, tmp_path: Path
) -> None:
    """examples/azureml/deploy.py as a user runs it: Model(ws, name=...), the notebook's
    conda Environment (found built, as in tests/node/test_guide.py), InferenceConfig,
    AciWebservice.deploy_configuration, Model.deploy, wait_for_deployment(True), state,
    get_logs, scoring_uri, run, delete."""
    train(serving, tmp_path, {"birds": 1})
    version = serving.versions["birds"]
    repository = f"{oci_registry.host}/envs"
    recipe = guide.guide_environment(serving.ns, repository)
    tag = environments.image_tag(environments.content_hash(recipe))
    push_archive(oci_registry, serving.node.images["pytorch"].archive, "envs", tag)
    root = tmp_path / "notebook"
    root.mkdir()
    for name in ("pytorch_score.py", "pytorch_train.py", "birds_data.py"):
        shutil.copy(BIRDS / name, root / name)
    shutil.copy(REPO / "examples" / "azureml" / "deploy.py", root / "deploy.py")
    shutil.copy(REPO / "examples" / "azureml" / "conda_dependencies.yml", root)
    (root / ".torchyard").mkdir()
    (root / ".torchyard" / "config.json").write_text(
        json.dumps(
            {
                "namespace": serving.ns,
                "imageRepository": repository,
                "insecureRegistry": True,
                "serviceAccount": "trainer",
                "registryService": serving.ref,
            }
        )
    )
    user_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "deploy.py"],
        cwd=root,
        env={**user_env, "KUBECONFIG": str(serving.cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = done.stdout + done.stderr
    took = time.monotonic() - started
    print(f"\n[node] the notebook's deploy section: exit {done.returncode} in {took:.1f}s")
    assert done.returncode == 0, out + describe(serving, "aci-birds")
    assert f"pytorch-birds\tpytorch-birds:{version}\t{version}" in out
    assert "Healthy" in out and f"http://aci-birds.{serving.ns}.svc/score" in out
    assert "init() returned" in out  # get_logs printed the serving Pod's log
    _, images = bird_image()
    label, probability = offline(model_file(serving, version), images)
    # print(result): the answer run() returned, as the notebook prints it
    assert f"'label': '{label}'" in out, out
    said = out.split("'probability': '", 1)[1].split("'", 1)[0]
    assert abs(float(said) - probability) < 1e-4, (said, probability)
    assert k8s.get_or_none(k8s.ONLINEENDPOINTS, serving.ns, "aci-birds") is None  # deleted

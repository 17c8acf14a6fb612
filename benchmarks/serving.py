"""Serving on a REAL node: the birds endpoint (an OnlineEndpoint with the guide's
``pytorch_score.py``) against a bare Starlette/Uvicorn app calling the same ``score.py``
in the same kind of Pod, side by side in one run; and the time from creating the endpoint
to its being Ready.

Both arms run on the harness's real kubelet node (tests/cluster/realnode.py) in the same
CPU PyTorch image, with the same resources, the same model files (the endpoint's inputs
cache entry, mounted read-only at ``AZUREML_MODEL_DIR``), the same code (one ConfigMap),
the same server libraries (the serving init container's copies) and a Service each:
  - torchyard: the OnlineEndpoint's Pod, ``python -m torchyard.serving``: a caller's token
    checked (by the registry service once, then kept), the body's limit, ``run()`` on a
    thread within the request's time, metrics, the Open Inference Protocol's routes;
  - bare: ``bare_app.py`` (written here): ``init()`` at start, one Starlette route that
    hands the body to ``run()`` in Starlette's thread pool and returns its JSON.
The model is trained and registered first by a small TrainingRun of the birds example.
The client runs on this machine: ``--concurrency`` threads, each with its own kept-alive
connection to the Service's ClusterIP (kube-proxy), sending the same bird image (the
guide's JSON ``{"data": [...]}``), ``--requests`` per arm and repetition after a warm-up,
the arms alternating; every answer must be 200 and name the same label. It prints each
repetition, the medians of p50 and p99 latency and of requests per second, and the ratio
of torchyard's p50 to the bare app's (target <= 1.15). Deploy to Ready is timed twice:
the first endpoint (its model fetched into the inputs cache) and a second one of the same
model (cached), the images cached both times (target <= 20 s).

    .venv/bin/python benchmarks/serving.py [--requests 400] [--concurrency 4] [--repeats 3]
    .venv/bin/python benchmarks/serving.py --smoke   # 1 repeat of 40 requests

Needs root and the real node's set-up (``make node`` once, cached); one real node per
machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "operator"),
]

from benchmarks import real_launch, record  # noqa: E402
from benchmarks.real_launch import BenchError  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import Cluster  # noqa: E402
from tests.cluster.realnode import NodeError, RealNode  # noqa: E402
from tests.cluster.session import operator_on_real_node  # noqa: E402
from tests.integration.conftest import _host_address, stand_in_service  # noqa: E402
from tests.integration.helpers import host_volume  # noqa: E402
from tests.integration.test_registry_service import Service, trainer_token  # noqa: E402

from torchyard import api, k8s  # noqa: E402
from torchyard.api import wire  # noqa: E402
from torchyard.planning import endpoints as plans  # noqa: E402
from torchyard.planning import names  # noqa: E402
from torchyard.sdk import snapshots  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIRDS = REPO / "examples" / "birds"
TRAIN_RUN = "birds-train"
NS = "serving"
TARGET, DEPLOY_TARGET = 1.15, 20.0
CPU, MEMORY = "500m", "1Gi"
BARE = "bare"
BARE_APP = '''"""The bare app: the same score.py behind one Starlette route, on Uvicorn."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_score as score  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

score.init()


async def handle(request):
    body = (await request.body()).decode()
    result = await run_in_threadpool(score.run, body)
    return Response(json.dumps(result), media_type="application/json")


app = Starlette(routes=[Route("/score", handle, methods=["POST"])])
uvicorn.run(app, host="0.0.0.0", port=8080, access_log=False, log_level="warning")
'''


def wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    return real_launch.wait(what, check, timeout, lambda: real_launch.describe(NS, ""))


@dataclass
class Place:
    """What the namespace holds for the benchmark."""

    registry: Service
    token: str = ""
    source: dict[str, str] | None = None
    version: int = 0


def settings(place: dict[str, Any]) -> Callable[[Cluster, RealNode], dict[str, str]]:
    """The operator's environment: the registry service on this machine behind a Service,
    the inputs cache on a host folder, the torchyard image for its init containers; the
    KWOK nodes cordoned, so that every Pod runs on the real node."""

    def make(cluster: Cluster, node: RealNode) -> dict[str, str]:
        address = _host_address()
        root = Path(tempfile.mkdtemp(prefix="serving-registry-"))
        svc = Service(root, host=address)
        stand_in_service(cluster, NS, address, svc.port)
        ip = k8s.get(k8s.SERVICES, NS, "torchyard-registry")["spec"]["clusterIP"]
        cache = Path(tempfile.mkdtemp(prefix="serving-cache-"))
        cache.chmod(0o777)
        host_volume(cluster, "serving-cache", str(cache))
        token = root / "operator-token"
        token.write_text(trainer_token(NS))
        place["registry"] = Place(svc)
        # the inputs' fetch Jobs have no node selector: with the KWOK nodes cordoned they
        # can only go to the real node (a fetch on a KWOK node never runs)
        for other in k8s.list_(k8s.NODES):
            name = other["metadata"]["name"]
            if name != node.name and not other["spec"].get("unschedulable"):
                cluster.kubectl("cordon", name)
        return {
            "TORCHYARD_INIT_IMAGE": node.images["torchyard"].ref,
            "TORCHYARD_REGISTRY_URL": f"http://{ip}:8080",
            "TORCHYARD_REGISTRY_TOKEN_FILE": str(token),
            "TORCHYARD_INPUTS_STORAGE_CLASS": "serving-cache",
            "TORCHYARD_INPUTS_CACHE_SIZE": "1Gi",
        }

    return make


def prepare(node: RealNode, place: Place) -> None:
    """The Environment, the code's ConfigMap, who may call, and the trained model."""
    k8s.create(
        {
            "apiVersion": api.API_VERSION,
            "kind": "Environment",
            "metadata": {"name": "pytorch", "namespace": NS},
            "spec": {"image": node.images["pytorch"].ref},
        }
    )
    rule = {"apiGroups": [api.GROUP], "resources": ["onlineendpoints"], "verbs": ["get"]}
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "call", "namespace": NS},
            "rules": [rule],
        }
    )
    subject = {"kind": "ServiceAccount", "name": "trainer", "namespace": NS}
    k8s.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "call", "namespace": NS},
            "subjects": [subject],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "call"},
        }
    )
    code = Path(tempfile.mkdtemp(prefix="serving-code-"))
    for name in ("pytorch_score.py", "pytorch_train.py", "birds_data.py"):
        shutil.copy(BIRDS / name, code / name)
    (code / "bare_app.py").write_text(BARE_APP)
    snap = snapshots.snapshot(code)
    try:
        snapshots.store(snap, NS, _no_registry)
        place.source = dict(snap.source)
    finally:
        snap.close()
    place.version = train(node, place)


def _no_registry() -> Any:
    raise BenchError("the scoring code is small: its snapshot fits a ConfigMap")


def train(node: RealNode, place: Place) -> int:
    """A small birds run that registers model pytorch-birds; its version."""
    assert place.source is not None
    run = {
        "apiVersion": api.API_VERSION,
        "kind": "TrainingRun",
        # not the endpoint's name: a run's headless Service bears the run's name, and the
        # endpoint's Service (its scoring URI's host) the endpoint's
        "metadata": {"name": TRAIN_RUN, "namespace": NS},
        "spec": {
            "environment": "pytorch",
            "source": place.source,
            "command": [
                "python",
                "pytorch_train.py",
                "--num_epochs",
                "1",
                "--pretrain_epochs",
                "1",
                "--images",
                "80",
                "--output_dir",
                "./outputs",
            ],
            "compute": {"pool": node.pool},
            "resources": {"cpu": "250m", "memory": "1Gi", "shmSize": "64Mi"},
            "runAsUser": 1000,
            "serviceAccountName": "trainer",
            "outputs": {"register": {"model": "pytorch-birds", "path": "outputs/model.pt"}},
        },
    }
    k8s.create(run)

    def ended() -> dict[str, Any] | None:
        st = k8s.get(k8s.TRAININGRUNS, NS, TRAIN_RUN).get("status") or {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait("the birds run", ended, 600)
    if st["phase"] != "Succeeded":
        raise BenchError(f"the birds run failed: {st.get('failure') or st.get('message')}")
    return int(st["model"]["version"])


def endpoint(node: RealNode, place: Place, name: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "OnlineEndpoint",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"uri": f"model://pytorch-birds/{place.version}"},
            "environment": "pytorch",
            "source": place.source,
            "entryScript": "pytorch_score.py",
            "compute": {"pool": node.pool},
            "resources": {"cpu": CPU, "memory": MEMORY},
            "serviceAccountName": "trainer",
        },
    }


def deploy(node: RealNode, place: Place, name: str) -> tuple[float, dict[str, Any]]:
    """Create endpoint ``name``; seconds until it is Ready, and its status."""
    started = time.monotonic()
    k8s.create(endpoint(node, place, name))

    def serving() -> dict[str, Any] | None:
        st = k8s.get(k8s.ONLINEENDPOINTS, NS, name).get("status") or {}
        if st.get("phase") == "Failed":
            raise BenchError(f"endpoint {name} failed: {st.get('message')}")
        return st if st.get("phase") == "Ready" else None

    st = wait(f"endpoint {name} Ready", serving, 300)
    took = time.monotonic() - started
    for pod in k8s.list_(k8s.PODS, NS, label_selector=f"{names.LABEL_ENDPOINT}={name}"):
        if pod["spec"].get("nodeName") != node.name:
            raise BenchError(f"{pod['metadata']['name']} ran on {pod['spec'].get('nodeName')!r}")
    return took, st


def bare_deployment(node: RealNode, place: Place, st: dict[str, Any]) -> None:
    """The bare app's Deployment and Service: the endpoint's Pod (the same image, init
    container, model mount, code and resources) running ``bare_app.py`` instead."""
    body = endpoint(node, place, BARE)
    body["spec"]["public"] = True  # (the bare app checks no token)
    ep = api.parse_endpoint(body)
    track = plans.tracks(ep, place.version)[0]
    parts = plans.PodInputs(
        "pytorch-birds",
        node.images["pytorch"].ref,
        str(st["inputs"][0]["key"]),
        plans.Settings(init_image=node.images["torchyard"].ref),
    )
    pod = plans.pod_spec(ep, track, parts)
    container = pod["containers"][0]
    container["command"] = ["python3", "/workspace/bare_app.py"]
    for probe in ("readinessProbe", "livenessProbe"):
        container.pop(probe)
    labels = {"app": BARE}
    k8s.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": BARE, "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        }
    )
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": BARE, "namespace": NS},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )


@dataclass
class Load:
    """One arm's repetition: every latency (s), the wall time, the labels answered."""

    latencies: list[float]
    seconds: float
    labels: set[str]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


def load(ip: str, body: bytes, token: str, requests: int, concurrency: int) -> Load:
    """``requests`` POSTs to ``ip``'s /score from ``concurrency`` threads, each on its own
    kept-alive connection."""
    latencies: list[float] = []
    labels: set[str] = set()
    errors: list[str] = []
    lock = threading.Lock()
    left = [requests]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    def worker() -> None:
        conn = http.client.HTTPConnection(ip, 80, timeout=60)
        try:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                started = time.perf_counter()
                conn.request("POST", "/score", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                took = time.perf_counter() - started
                with lock:
                    if response.status != 200:
                        errors.append(f"{response.status}: {data[:200]!r}")
                        return
                    latencies.append(took)
                    labels.add(json.loads(data)["label"])
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if errors or len(latencies) != requests:
        raise BenchError(f"{len(errors)} failed requests (answered {len(latencies)}): {errors[:3]}")
    return Load(latencies, seconds, labels)


def request_body() -> bytes:
    sys.path.insert(0, str(BIRDS))
    try:
        import birds_data
    finally:
        sys.path.remove(str(BIRDS))
    images, _ = birds_data.birds(1, seed=11)
    return json.dumps({"data": images.tolist()}).encode()


def compare(
    node: RealNode, place: Place, *, requests: int, concurrency: int, repeats: int, warmup: int
) -> dict[str, Any]:
    """Deploy twice, then the two arms' load, ``repeats`` times alternating."""
    prepare(node, place)
    cold, st = deploy(node, place, "birds")
    warm, _ = deploy(node, place, "birds-again")
    print(f"deploy -> Ready: {cold:.1f}s (model fetched), {warm:.1f}s (model cached)", flush=True)
    bare_deployment(node, place, st)
    ips = {
        arm: k8s.get(k8s.SERVICES, NS, svc)["spec"]["clusterIP"]
        for arm, svc in (("torchyard", "birds"), ("bare", BARE))
    }
    token = k8s.request_token(NS, "trainer", [wire.endpoint_audience(NS, "birds")])
    tokens = {"torchyard": token, "bare": ""}
    body = request_body()
    wait("the bare app answering", lambda: _answers(ips["bare"], body), 300)
    for arm in ips:  # warm-up: imports, the token's decision, the connections
        load(ips[arm], body, tokens[arm], max(warmup, concurrency), concurrency)
    runs: dict[str, list[Load]] = {"torchyard": [], "bare": []}
    for i in range(repeats):
        for arm in ("torchyard", "bare") if i % 2 == 0 else ("bare", "torchyard"):
            got = load(ips[arm], body, tokens[arm], requests, concurrency)
            runs[arm].append(got)
            print(
                f"run {i + 1}/{repeats} {arm:9s} p50 {got.p50 * 1000:6.2f} ms  p99 "
                f"{got.p99 * 1000:7.2f} ms  {got.rate:6.1f} req/s  labels {sorted(got.labels)}",
                flush=True,
            )
    labels = {label for loads in runs.values() for got in loads for label in got.labels}
    if len(labels) != 1:
        raise BenchError(f"the arms answered differently: {sorted(labels)}")
    return {"runs": runs, "cold": cold, "warm": warm}


def _answers(ip: str, body: bytes) -> bool:
    try:
        conn = http.client.HTTPConnection(ip, 80, timeout=10)
        conn.request("POST", "/score", body=body)
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="per arm and repetition")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="1 repeat of 40 requests")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.repeats, args.warmup = 40, 1, 8
    rec = record.Record("serving", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    place: dict[str, Any] = {}
    try:
        with operator_on_real_node(NS, settings(place)) as (_cluster, node):
            got = compare(
                node,
                place["registry"],
                requests=args.requests,
                concurrency=args.concurrency,
                repeats=args.repeats,
                warmup=args.warmup,
            )
    except (BenchError, NodeError) as err:
        print(f"serving: {err}", file=sys.stderr)
        return 1
    finally:
        if "registry" in place:
            place["registry"].registry.stop()
    summarise(rec, got, args)
    rec.write()
    return 0


def summarise(rec: record.Record, got: dict[str, Any], args: argparse.Namespace) -> None:
    runs = got["runs"]
    for arm, loads in runs.items():
        for i, one in enumerate(loads):
            rec.round(
                arm=arm, run=i + 1, p50_ms=one.p50 * 1000, p99_ms=one.p99 * 1000, rps=one.rate
            )
    med = {
        arm: {k: statistics.median(getattr(x, k) for x in loads) for k in ("p50", "p99", "rate")}
        for arm, loads in runs.items()
    }
    ratio = med["torchyard"]["p50"] / med["bare"]["p50"]
    rounds = [t.p50 / b.p50 for t, b in zip(runs["torchyard"], runs["bare"], strict=True)]
    what = f"birds /score, {args.concurrency} clients"
    bare = "bare Starlette/Uvicorn app, the same score.py"
    rec.figure(
        f"p50 latency, {what}",
        med["torchyard"]["p50"] * 1000,
        "ms",
        baseline=(bare, med["bare"]["p50"] * 1000),
        ratio=ratio,
        ratio_spread=(min(rounds), max(rounds)),
        target=f"<= {TARGET:.2f}",
        met=ratio <= TARGET,
    )
    rec.figure(
        f"p99 latency, {what}",
        med["torchyard"]["p99"] * 1000,
        "ms",
        baseline=(bare, med["bare"]["p99"] * 1000),
        ratio=med["torchyard"]["p99"] / med["bare"]["p99"],
    )
    rec.figure(
        f"requests per second, {what}",
        med["torchyard"]["rate"],
        "req/s",
        baseline=(bare, med["bare"]["rate"]),
        ratio=med["torchyard"]["rate"] / med["bare"]["rate"],
    )
    rec.figure(
        "deploy -> Ready, model fetched into the cache (images cached)",
        got["cold"],
        "s",
        target=f"<= {DEPLOY_TARGET:.0f}",
        met=got["cold"] <= DEPLOY_TARGET,
    )
    rec.figure(
        "deploy -> Ready, model in the cache (images cached)",
        got["warm"],
        "s",
        target=f"<= {DEPLOY_TARGET:.0f}",
        met=got["warm"] <= DEPLOY_TARGET,
    )
    print(
        f"ratio torchyard / bare p50: {ratio:.2f} (per round {min(rounds):.2f}-{max(rounds):.2f})"
        f"  (target <= {TARGET:.2f}: {'target met' if ratio <= TARGET else 'TARGET MISSED'})"
    )


if __name__ == "__main__":
    sys.exit(main())

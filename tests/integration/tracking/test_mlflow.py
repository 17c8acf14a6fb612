"""One MLflow run per TrainingRun, against a real ``mlflow server`` (PyPI's, installed by
``make mlflow`` into a venv of its own, with a SQLite backend store) and the real control
plane: a run's MLflow run is created before its Pods, once across an operator restart,
with torchyard's parameters, tags and final status; a Sweep's trials are children of one
parent run; a server that cannot be reached or refuses leaves the training untouched and
says so (TrackingReady=False, a Warning Event)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import (
    conditions,
    finish_pod,
    run_pods,
    wait_event,
    wait_for,
    wait_status,
)
from tests.integration.test_archiving import TRAIN, allow_default_service_account, run_node
from tests.integration.test_archiving import archiving_operator as archiving_operator
from tests.integration.test_registry_service import Service
from torchyard import api, k8s
from torchyard.controller import context, tracking
from torchyard.planning import pods
from torchyard.planning import tracking as plan

LOCK = Path(__file__).with_name("requirements.lock")


def _venv() -> Path:
    """The venv ``make mlflow`` installed (keyed by the lock's hash, as the Makefile)."""
    if os.environ.get("TORCHYARD_MLFLOW_VENV"):
        return Path(os.environ["TORCHYARD_MLFLOW_VENV"])
    cache = Path(os.environ.get("TORCHYARD_CACHE") or Path.home() / ".cache" / "torchyard")
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    return cache / f"mlflow-venv-py{sys.version_info[0]}.{sys.version_info[1]}-{key}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except (urllib.error.URLError, OSError):
        return 0


@contextmanager
def serving(store: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """A real MLflow tracking server on ``host`` (the node tests: an address the node's
    Pods reach), its SQLite store and artifacts in ``store``; yields its URI."""
    venv = _venv()
    assert (venv / ".complete").exists(), f"no MLflow server at {venv}: run 'make mlflow'"
    port = _free_port()
    log = (store / "server.log").open("w")
    server = subprocess.Popen(
        [
            str(venv / "bin" / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{store}/mlflow.db",
            "--default-artifact-root",
            str(store / "artifacts"),
            "--host",
            host,
            "--port",
            str(port),
            "--allowed-hosts",  # (its Host header check: this address, named)
            f"{host},{host}:{port}",
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uri = f"http://{host}:{port}"
    try:
        wait_for("the MLflow server", lambda: _get(f"{uri}/health") == 200, timeout=120)
        yield uri
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # (its gunicorn workers, slow to end under load)
            server.kill()
            server.wait(30)
        log.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on this machine, for the session."""
    with serving(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@contextmanager
def tracking_to(operator: InProcessOperator, uri: str) -> Iterator[None]:
    """The in-process operator restarted with the chart's tracking.mlflow.uri set."""
    operator.stop()
    os.environ["TORCHYARD_MLFLOW_URI"] = uri
    operator.start()
    try:
        yield
    finally:
        operator.stop()
        os.environ.pop("TORCHYARD_MLFLOW_URI")
        operator.start()


def mlflow(uri: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def runs_tagged(uri: str, experiment_id: str, tag: str, value: str) -> list[dict[str, Any]]:
    found = mlflow(
        uri,
        "runs/search",
        {"experiment_ids": [experiment_id], "filter": f"tags.`{tag}` = '{value}'"},
    )
    return list(found.get("runs") or [])


def by_key(entries: list[dict[str, Any]]) -> dict[str, str]:
    return {e["key"]: e["value"] for e in entries}


def trainer_env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def tracked(status: dict[str, Any]) -> bool:
    return bool((status.get("tracking") or {}).get("runId")) and status.get("phase") == "Running"


def test_a_run_is_one_mlflow_run_with_its_params_tags_and_end_across_a_restart(
    cluster: Cluster, env: str, operator: InProcessOperator, mlflow_server: str
) -> None:
    ns = env
    run = TrainingRunBuilder("birds", ns).environment("pytorch").nodes(2).procs(2).pool("cpu")
    with tracking_to(operator, mlflow_server):
        k8s.create(run.command("python", "train.py", "--lr", "0.01").obj())
        seen = wait_status(k8s.TRAININGRUNS, ns, "birds", tracked)["status"]
        ids = seen["tracking"]
        assert ids["experiment"] == ns  # no experiment label: the namespace
        assert conditions({"status": seen})["TrackingReady"]["status"] == "True"
        pods = run_pods(ns, "birds")
        assert len(pods) == 2
        for pod in pods:  # every process gets the one run
            variables = trainer_env(pod)
            assert variables["MLFLOW_TRACKING_URI"] == mlflow_server
            assert variables["MLFLOW_RUN_ID"] == ids["runId"]
            assert variables["MLFLOW_EXPERIMENT_ID"] == ids["experimentId"]

        operator.stop()  # a restart: the status keeps the run, no second one
        operator.start()
        for pod in pods:
            finish_pod(cluster, ns, pod["metadata"]["name"], 0)
        done = wait_status(
            k8s.TRAININGRUNS,
            ns,
            "birds",
            lambda s: s.get("phase") == "Succeeded" and s.get("tracking", {}).get("ended"),
        )["status"]
        assert done["tracking"]["runId"] == ids["runId"]

    mine = runs_tagged(mlflow_server, ids["experimentId"], "torchyard.run", "birds")
    assert [r["info"]["run_id"] for r in mine] == [ids["runId"]]
    info, data = mine[0]["info"], mine[0]["data"]
    assert info["status"] == "FINISHED" and info["end_time"] >= info["start_time"]
    params, tags = by_key(data["params"]), by_key(data["tags"])
    assert params["torchyard.world_size"] == "4" and params["torchyard.nodes"] == "2"
    assert json.loads(params["torchyard.command"]) == ["python", "train.py", "--lr", "0.01"]
    assert params["torchyard.image"] == "ghcr.io/acme/pytorch:2.15-cuda12"
    assert tags["torchyard.namespace"] == ns and tags["torchyard.run"] == "birds"
    assert tags["torchyard.phase"] == "Succeeded" and tags["torchyard.attempt"] == "0"
    assert "mlflow.parentRunId" not in tags


def test_a_sweeps_trials_are_children_of_one_parent_run(
    env: str, operator: InProcessOperator, mlflow_server: str
) -> None:
    ns = env
    trial = TrainingRunBuilder("trial").environment("pytorch").pool("cpu")
    sweep = SweepBuilder("tune", ns).trial(trial).trials(3, 3).seed(7).obj()
    with tracking_to(operator, mlflow_server):
        k8s.create(sweep)

        def trials() -> list[dict[str, Any]] | None:
            runs = k8s.list_(k8s.TRAININGRUNS, ns, label_selector="torchyard.dev/sweep=tune")
            ids = [(r.get("status") or {}).get("tracking", {}).get("runId") for r in runs]
            return runs if len(runs) == 3 and all(ids) else None

        runs = wait_for("three tracked trials", trials, timeout=60)
    experiment = runs[0]["status"]["tracking"]["experimentId"]
    uid = k8s.get(k8s.SWEEPS, ns, "tune")["metadata"]["uid"]
    parents = runs_tagged(mlflow_server, experiment, "torchyard.sweep_uid", uid)
    assert len(parents) == 1
    parent = parents[0]["info"]["run_id"]
    children = runs_tagged(mlflow_server, experiment, "mlflow.parentRunId", parent)
    assert sorted(r["info"]["run_id"] for r in children) == sorted(
        r["status"]["tracking"]["runId"] for r in runs
    )
    for child in children:  # each with its own sweep parameters
        params = by_key(child["data"]["params"])
        assert set(params) > {"torchyard.world_size", "learning_rate"}


@pytest.mark.parametrize("server", ["unreachable", "refusing"])
def test_a_server_that_fails_leaves_the_training_untouched_and_says_so(
    cluster: Cluster, env: str, operator: InProcessOperator, mlflow_server: str, server: str
) -> None:
    ns = env
    # nothing listens on a port just freed; a path the server has no API under: HTTP 404
    uri = f"http://127.0.0.1:{_free_port()}" if server == "unreachable" else f"{mlflow_server}/no"
    with tracking_to(operator, uri):
        k8s.create(
            TrainingRunBuilder("birds", ns).environment("pytorch").nodes(2).pool("cpu").obj()
        )

        def warned(status: dict[str, Any]) -> bool:
            ready = conditions({"status": status}).get("TrackingReady") or {}
            return status.get("phase") == "Running" and ready.get("reason") == "TrackingServerError"

        seen = wait_status(k8s.TRAININGRUNS, ns, "birds", warned)["status"]
        message = conditions({"status": seen})["TrackingReady"]["message"]
        assert uri in message
        assert (
            ("cannot be reached" in message) if server == "unreachable" else ("HTTP 404" in message)
        )
        events = wait_event(
            ns, "birds", "TrackingFailed", lambda e: e["reason"] == "TrackingFailed"
        )
        assert any(e["type"] == "Warning" for e in events if e["reason"] == "TrackingFailed")
        pods = run_pods(ns, "birds")
        for pod in pods:  # no run id: a script's mlflow calls open no stray run
            assert not any(k.startswith("MLFLOW_") for k in trainer_env(pod))
            finish_pod(cluster, ns, pod["metadata"]["name"], 0)
        wait_status(k8s.TRAININGRUNS, ns, "birds", lambda s: s.get("phase") == "Succeeded")


def test_progress_is_mirrored_at_its_step_once_and_a_failure_ends_the_run_failed(
    mlflow_server: str,
) -> None:
    """``controller.tracking`` against the real server, as a reconcile calls it (the
    progress a KWOK Pod cannot log comes from the status here)."""
    settings = pods.Settings(tracking=plan.Settings(uri=mlflow_server))
    ctx = context.Context(k8s=None, settings=settings)  # type: ignore[arg-type]
    body = TrainingRunBuilder("direct", "tracking-direct").obj()
    body["metadata"]["uid"] = f"uid-{time.monotonic_ns()}"
    run = api.parse_trainingrun(body)
    log = logging.getLogger("test")
    now = datetime.now(timezone.utc)
    state = tracking.start(ctx, run, {}, "img", now, log)
    assert state is not None and state.get("runId") and not state.get("error"), state
    for i, step in enumerate((10, 20, 20)):  # the same step twice: one point
        status = {"phase": "Running", "progress": {"step": step, "metrics": {"loss": 1 / step}}}
        state = tracking.mirror(
            ctx, run, {"tracking": state}, status, None, now + timedelta(seconds=i), log
        ).state
        assert state is not None and state["step"] == step
    failed = {"phase": "Failed", "restarts": 1, "failure": {"failureClass": "OutOfMemory"}}
    mirrored = tracking.mirror(ctx, run, {"tracking": state}, failed, None, now, log)
    assert mirrored.state is not None and mirrored.state["ended"] and mirrored.retry is None

    history = urllib.request.urlopen(
        f"{mlflow_server}/api/2.0/mlflow/metrics/get-history?run_id={state['runId']}&metric_key=loss",
        timeout=10,
    )
    points = json.loads(history.read())["metrics"]
    assert [(p["step"], p["value"]) for p in points] == [(10, 0.1), (20, 0.05)]
    got = mlflow(mlflow_server, "runs/search", {"experiment_ids": [state["experimentId"]]})
    (ended,) = [r for r in got["runs"] if r["info"]["run_id"] == state["runId"]]
    tags = by_key(ended["data"]["tags"])
    assert ended["info"]["status"] == "FAILED"
    assert tags["torchyard.failure_class"] == "OutOfMemory" and tags["torchyard.attempt"] == "1"


def test_a_run_ended_while_the_server_failed_is_cleaned_up_and_ended_in_mlflow_later(
    cluster: Cluster, env: str, operator: InProcessOperator, mlflow_server: str
) -> None:
    ns = env
    run = TrainingRunBuilder("later", ns).environment("pytorch").pool("cpu")
    with tracking_to(operator, mlflow_server):
        k8s.create(run.with_("spec.policy.ttlSecondsAfterFinished", 1).obj())
        ids = wait_status(k8s.TRAININGRUNS, ns, "later", tracked)["status"]["tracking"]
    with tracking_to(operator, f"http://127.0.0.1:{_free_port()}"):  # the server went away
        for pod in run_pods(ns, "later"):
            finish_pod(cluster, ns, pod["metadata"]["name"], 0)

        def failing(status: dict[str, Any]) -> bool:
            ready = conditions({"status": status}).get("TrackingReady") or {}
            return (
                status.get("phase") == "Succeeded" and ready.get("reason") == "TrackingServerError"
            )

        failed = wait_status(k8s.TRAININGRUNS, ns, "later", failing)["status"]["tracking"]
        assert failed["runId"] == ids["runId"] and "cannot be reached" in failed["error"]
        # the TTL does not wait for the tracking server
        wait_for("the Pods cleaned up", lambda: not run_pods(ns, "later"), timeout=15)
        assert not k8s.get(k8s.TRAININGRUNS, ns, "later")["status"]["tracking"].get("ended")
    with tracking_to(operator, mlflow_server):  # back: the run is ended once
        done = wait_status(
            k8s.TRAININGRUNS, ns, "later", lambda s: s.get("tracking", {}).get("ended"), timeout=60
        )["status"]
        assert conditions({"status": done})["TrackingReady"]["status"] == "True"
    (ended,) = runs_tagged(mlflow_server, ids["experimentId"], "torchyard.run", "later")
    assert ended["info"]["run_id"] == ids["runId"] and ended["info"]["status"] == "FINISHED"


def override(namespace: str, **data: str) -> None:
    """The namespace's torchyard-tracking ConfigMap, created or replaced."""
    k8s.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": plan.OVERRIDE_CONFIGMAP, "namespace": namespace},
            "data": data,
        }
    )


def test_a_namespaces_configmap_takes_precedence_over_the_charts_server(
    env: str, operator: InProcessOperator, mlflow_server: str
) -> None:
    ns = env
    # the chart's server is one that is not there; the namespace names the real one
    override(ns, mlflowUri=mlflow_server, credentialsSecret="team-mlflow")
    with tracking_to(operator, f"http://127.0.0.1:{_free_port()}"):
        k8s.create(TrainingRunBuilder("own", ns).environment("pytorch").pool("cpu").obj())
        ids = wait_status(k8s.TRAININGRUNS, ns, "own", tracked)["status"]["tracking"]
        (pod,) = run_pods(ns, "own")
        variables = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert variables["MLFLOW_TRACKING_URI"]["value"] == mlflow_server
        secret = variables["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert secret["name"] == "team-mlflow"
        (found,) = runs_tagged(mlflow_server, ids["experimentId"], "torchyard.run", "own")
        assert found["info"]["run_id"] == ids["runId"]

    # mlflowUri "": no tracking in this namespace, whatever the chart says (an operator
    # started afresh reads it at once; a running one within OVERRIDE_SECONDS)
    override(ns, mlflowUri="")
    with tracking_to(operator, mlflow_server):
        k8s.create(TrainingRunBuilder("untracked", ns).environment("pytorch").pool("cpu").obj())
        running = wait_status(
            k8s.TRAININGRUNS, ns, "untracked", lambda s: s.get("phase") == "Running", timeout=60
        )["status"]
    assert "tracking" not in running
    assert "TrackingReady" not in conditions({"status": running})
    for pod in run_pods(ns, "untracked"):
        assert not any(k.startswith("MLFLOW_") for k in trainer_env(pod))


def registering(
    uri: str, model: str, version: int, **register: Any
) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    """A run that registers ``model`` (``outputs.register`` with ``register``), tracked
    through ``controller.tracking`` as a reconcile calls it: its started MLflow run, and
    what ending it once it registered ``model``/``version`` leaves (each call from that
    started state: an operator that restarted before it wrote the status)."""
    settings = pods.Settings(tracking=plan.Settings(uri=uri))
    ctx = context.Context(k8s=None, settings=settings)  # type: ignore[arg-type]
    body = TrainingRunBuilder("reg", "tracking-registry").register(model, **register).obj()
    body["metadata"]["uid"] = f"uid-{time.monotonic_ns()}"
    run = api.parse_trainingrun(body)
    log = logging.getLogger("test")
    now = datetime.now(timezone.utc)
    started = tracking.start(ctx, run, {}, "img", now, log)
    assert started is not None and started["runId"]
    done = {"phase": "Succeeded", "model": {"name": model, "version": version}}

    def end() -> dict[str, Any]:
        state = tracking.mirror(ctx, run, {"tracking": started}, done, None, now, log).state
        assert state is not None
        return state

    return started, end


def test_a_registered_model_version_is_registered_in_mlflows_model_registry_once(
    mlflow_server: str,
) -> None:
    """``controller.tracking`` against the real server as a reconcile calls it: a run
    that registered ModelVersion birds/3 with ``mlflowRegistry`` asked."""
    model = f"birds-{time.monotonic_ns()}"
    started, end = registering(mlflow_server, model, 3, mlflowRegistry=True)
    assert end()["ended"] and end()["modelVersion"] == "1"
    # an operator that restarted before it wrote that status registers no second version
    assert end()["modelVersion"] == "1"

    (version,) = mlflow_get(mlflow_server, "model-versions/search", {"filter": f"name='{model}'"})[
        "model_versions"
    ]
    assert version["run_id"] == started["runId"] and version["source"] == f"model://{model}/3"
    tags = by_key(version["tags"])
    assert tags["torchyard.model_version"] == f"{model}/3"
    assert tags["torchyard.namespace"] == "tracking-registry"
    registered = mlflow_get(mlflow_server, "registered-models/get", {"name": model})
    assert by_key(registered["registered_model"]["tags"]) == {
        "torchyard.namespace": "tracking-registry"
    }


def test_no_model_registry_version_unless_asked(mlflow_server: str) -> None:
    model = f"plain-{time.monotonic_ns()}"
    _, end = registering(mlflow_server, model, 1)
    ended = end()
    assert ended["ended"] and "modelVersion" not in ended
    found = mlflow_get(mlflow_server, "model-versions/search", {"filter": f"name='{model}'"})
    assert not found.get("model_versions")


def mlflow_get(uri: str, path: str, query: dict[str, str]) -> dict[str, Any]:
    url = f"{uri}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def test_the_operator_registers_a_runs_model_version_in_mlflow_when_asked(
    cluster: Cluster,
    namespace: str,
    operator: InProcessOperator,
    archiving_operator: Service,
    mlflow_server: str,
    tmp_path: Path,
) -> None:
    """The whole way: the node archives its outputs, the operator promotes them to
    ModelVersion birds-v1 and registers that version in MLflow's model registry."""
    ns = namespace
    allow_default_service_account(ns)
    k8s.create(environment("pytorch", ns))
    run = TrainingRunBuilder("birds", ns).environment("pytorch").pool("cpu")
    with tracking_to(operator, mlflow_server):
        k8s.create(run.register("birds", path="outputs", mlflowRegistry=True).obj())
        wait_status(k8s.TRAININGRUNS, ns, "birds", tracked)
        [pod] = run_pods(ns, "birds")
        done = run_node(pod, tmp_path, TRAIN)
        assert done.returncode == 0, done.stderr
        finish_pod(cluster, ns, pod["metadata"]["name"], 0)
        ended = wait_status(
            k8s.TRAININGRUNS,
            ns,
            "birds",
            lambda s: s.get("phase") == "Succeeded" and s.get("tracking", {}).get("ended"),
            timeout=60,
        )["status"]
    assert ended["model"] == {"name": "birds", "version": 1}
    assert ended["tracking"]["modelVersion"]
    found = mlflow_get(mlflow_server, "model-versions/search", {"filter": "name='birds'"})
    mine = [v for v in found["model_versions"] if v["run_id"] == ended["tracking"]["runId"]]
    assert [(v["version"], v["source"]) for v in mine] == [
        (ended["tracking"]["modelVersion"], "model://birds/1")
    ]

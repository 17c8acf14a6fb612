"""Helpers of the integration tests: waiting on status, finishing KWOK Pods, scraping
Prometheus metrics, and an operator in a process of its own (as a ServiceAccount)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster
from torchyard import api, k8s
from torchyard.controller import references


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def wait_event(
    namespace: str, name: str, what: str, matches: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The Events of object ``name`` once one ``matches``: a reconcile records its Events
    right after its status write, so a test that saw the status waits for them."""

    def found() -> list[dict[str, Any]] | None:
        events = k8s.list_(k8s.EVENTS, namespace, field_selector=f"involvedObject.name={name}")
        return events if any(matches(e) for e in events) else None

    result: list[dict[str, Any]] = wait_for(what, found, timeout=60)
    return result


def wait_status(
    res: k8s.Resource,
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], Any],
    timeout: float = 30,
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def matched() -> dict[str, Any] | None:
        nonlocal last
        last = k8s.get(res, namespace, name)
        return last if check(last.get("status") or {}) else None

    try:
        result: dict[str, Any] = wait_for(f"status of {name}", matched, timeout)
    except AssertionError:
        raise AssertionError(
            f"status of {name} never matched: {json.dumps(last.get('status'), indent=1)}"
        ) from None
    return result


@contextlib.contextmanager
def stand_in_kueue() -> Iterator[None]:
    """Kueue's LocalQueue CRD (a stand-in with an open schema; no Kueue controller runs)
    while the cluster has none, taken away afterwards: what the operator looks up for a
    run's ``scheduling.queueName`` (``controller.references``). With Kueue's own CRD
    already there (tests/integration/test_kueue.py), that one is used and kept."""
    if k8s.get_or_none(k8s.CRDS, None, k8s.LOCALQUEUES_CRD) is not None:
        yield
        return
    k8s.create(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": k8s.LOCALQUEUES_CRD},
            "spec": {
                "group": k8s.KUEUE_GROUP,
                "scope": "Namespaced",
                "names": {
                    "kind": "LocalQueue",
                    "listKind": "LocalQueueList",
                    "plural": "localqueues",
                    "singular": "localqueue",
                },
                "versions": [
                    {
                        "name": "v1beta2",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
    )

    def established() -> bool:
        crd = k8s.get(k8s.CRDS, None, k8s.LOCALQUEUES_CRD)
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []  # null at first
        )

    wait_for("the stand-in LocalQueue CRD established", established)
    try:
        yield
    finally:
        k8s.delete(k8s.CRDS, None, k8s.LOCALQUEUES_CRD)


def local_queue(namespace: str, name: str) -> None:
    """A LocalQueue ``name`` in ``namespace``, in the version the cluster's CRD serves
    (``stand_in_kueue`` or Kueue's own)."""
    version = references.served_version(k8s.get(k8s.CRDS, None, k8s.LOCALQUEUES_CRD))
    assert version is not None
    res = k8s.local_queues(version)
    k8s.rest.call(
        "POST",
        res.path(namespace),
        body={
            "apiVersion": res.api_version,
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": f"{name}-cq"},
        },
    )


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def run_pods(namespace: str, run: str) -> list[dict[str, Any]]:
    return sorted(
        k8s.list_(k8s.PODS, namespace, label_selector=f"torchyard.dev/run={run}"),
        key=lambda p: p["metadata"]["name"],
    )


def finish_pod(
    cluster: Cluster, namespace: str, pod: str, exit_code: int, message: str = "", reason: str = ""
) -> None:
    """Make KWOK end a running Pod with this exit code and termination message."""
    args = [
        "annotate",
        "pod",
        pod,
        "-n",
        namespace,
        "--overwrite",
        f"kwok.torchyard.dev/exit-code={exit_code}",
    ]
    if message:
        args.append(f"kwok.torchyard.dev/message={message}")
    if reason:
        args.append(f"kwok.torchyard.dev/reason={reason}")
    cluster.kubectl(*args)


def launcher_message(rank: int, node: int, exception: str) -> str:
    """What the launcher writes to the termination log for a failing rank."""
    return json.dumps(
        {
            "rank": rank,
            "localRank": rank % 2,
            "nodeRank": node,
            "exitCode": 1,
            "reason": "Error",
            "message": "Traceback (most recent call last):\n"
            f'  File "train.py", line 9\n{exception}',
        }
    )


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A Prometheus text-format page, as {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels)
        samples[(name, frozenset(pairs))] = float(value)
    return samples


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """One series' value (0 when absent: a counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


class OperatorProcess:
    """``python -m torchyard.controller`` in a process of its own (its own credentials,
    no shared ``torchyard.k8s`` client), its output in a log file."""

    def __init__(self, kubeconfig: Path, log: Path, *args: str, **env: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torchyard.controller", *args],
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "TORCHYARD_METRICS_PORT": "0", **env},
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM (Kopf stops gracefully), then SIGKILL after 30s; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._out.close()
        return self.process.returncode

    def __enter__(self) -> OperatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def local_node_env(pod: dict[str, Any], workdir: Path, service_account: str) -> dict[str, str]:
    """The environment of a node Pod's launcher run here as a process: the Pod's own
    variables, MASTER_ADDR on loopback, outputs, logs and the termination message in
    ``workdir``, and a registry token of ``service_account`` (as the projected one)."""
    from torchyard.api.wire import REGISTRY_AUDIENCE as AUDIENCE

    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    token = workdir / "token"
    token.write_text(k8s.request_token(pod["metadata"]["namespace"], service_account, [AUDIENCE]))
    env.update(
        MASTER_ADDR="127.0.0.1",
        TORCHYARD_OUTPUTS=str(workdir / "outputs"),
        TORCHYARD_LOGS=str(workdir / "logs"),
        TORCHYARD_REGISTRY_TOKEN_FILE=str(token),
        TORCHYARD_TERMINATION_LOG=str(workdir / "termination.json"),
        PATH=os.environ["PATH"],
    )
    return env


def refused_by_both(namespace: str, body: dict[str, Any], message: str) -> None:
    """The apiserver refuses TrainingRun ``body`` (invalid, ``message`` in its answer), and
    the models refuse it too (local mode and the SDK parse with them)."""
    body["metadata"]["namespace"] = namespace
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(body)
    assert err.value.invalid, err.value
    assert message in err.value.message
    with pytest.raises(api.InvalidSpec):
        api.parse_trainingrun(body)


def host_volume(
    cluster: Cluster, name: str, path: str, size: str = "2Gi", storage_class: str = ""
) -> None:
    """A statically provisioned PersistentVolume ``name`` (the host folder ``path``) of
    ``storage_class`` (default: a class of its own, its name), which a claim of that class
    and either access mode binds (the cluster has no provisioner); delete the PV after."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
            "storageClassName": storage_class or name,
            "hostPath": {"path": path},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))

"""Fixture builders for torchyard resources, in the JobSet style:

    run = TrainingRunBuilder("bert", "ns").nodes(2).procs(2).gpus(2).pool("a100").obj()

Each returns a plain wire-form dict, exactly what a user would ``kubectl apply``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import zipfile
from pathlib import Path
from typing import Any


class TrainingRunBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "environment": "pytorch",
                "source": {"image": True},
                "command": ["python", "train.py"],
            },
        }

    def _set(self, path: str, value: Any) -> TrainingRunBuilder:
        node = self._obj
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
        return self

    def environment(self, name: str) -> TrainingRunBuilder:
        return self._set("spec.environment", name)

    def command(self, *argv: str) -> TrainingRunBuilder:
        return self._set("spec.command", list(argv))

    def nodes(self, n: int) -> TrainingRunBuilder:
        return self._set("spec.distribution.nodeCount", n)

    def procs(self, n: int) -> TrainingRunBuilder:
        return self._set("spec.distribution.processCountPerNode", n)

    def launch(self, mode: str) -> TrainingRunBuilder:
        return self._set("spec.distribution.launch", mode)

    def master_port(self, port: int) -> TrainingRunBuilder:
        return self._set("spec.distribution.masterPort", port)

    def gpus(self, n: int) -> TrainingRunBuilder:
        return self._set("spec.resources.gpusPerNode", n)

    def pool(self, name: str) -> TrainingRunBuilder:
        return self._set("spec.compute.pool", name)

    def source(self, **source: Any) -> TrainingRunBuilder:
        return self._set("spec.source", source)

    def env(self, **variables: str) -> TrainingRunBuilder:
        return self._set("spec.env", [{"name": k, "value": v} for k, v in variables.items()])

    def register(self, model: str, **extra: Any) -> TrainingRunBuilder:
        return self._set("spec.outputs.register", {"model": model, **extra})

    def placement(self, level: str, mode: str = "required") -> TrainingRunBuilder:
        return self._set("spec.placement", {"topology": {"level": level, "mode": mode}})

    def with_(self, path: str, value: Any) -> TrainingRunBuilder:
        return self._set(path, value)

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


class SweepBuilder:
    """A Sweep shaped as the guide's notebook tunes the birds model: random sampling of
    learning_rate uniform(0.0005, 0.005) and momentum uniform(0.9, 0.99), best_val_acc
    maximized, 8 trials, 4 at a time (no early termination unless ``bandit``)."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "Sweep",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "trial": TrainingRunBuilder("trial").obj()["spec"],
                "parameters": {
                    "learning_rate": {"type": "uniform", "minValue": 0.0005, "maxValue": 0.005},
                    "momentum": {"type": "uniform", "minValue": 0.9, "maxValue": 0.99},
                },
                "sampling": "random",
                "objective": {"metric": "best_val_acc", "goal": "maximize"},
                "maxTotalTrials": 8,
                "maxConcurrentTrials": 4,
            },
        }

    def _set(self, path: str, value: Any) -> SweepBuilder:
        node = self._obj
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
        return self

    def trial(self, run: TrainingRunBuilder) -> SweepBuilder:
        return self._set("spec.trial", run.obj()["spec"])

    def parameters(self, **expressions: dict[str, Any]) -> SweepBuilder:
        return self._set("spec.parameters", expressions)

    def grid(self) -> SweepBuilder:
        return self._set("spec.sampling", "grid")

    def trials(self, total: int, concurrent: int | None = None) -> SweepBuilder:
        self._set("spec.maxTotalTrials", total)
        if concurrent is None:
            self._obj["spec"].pop("maxConcurrentTrials", None)
            return self
        return self._set("spec.maxConcurrentTrials", concurrent)

    def seed(self, seed: int) -> SweepBuilder:
        return self._set("spec.seed", seed)

    def objective(self, metric: str, goal: str = "maximize") -> SweepBuilder:
        return self._set("spec.objective", {"metric": metric, "goal": goal})

    def bandit(self, slack_factor: float, interval: int = 1, delay: int = 0) -> SweepBuilder:
        return self._set(
            "spec.earlyTermination",
            {
                "type": "bandit",
                "slackFactor": slack_factor,
                "evaluationInterval": interval,
                "delayEvaluation": delay,
            },
        )

    def register_best(self, model: str, path: str = "outputs") -> SweepBuilder:
        return self._set("spec.registerBest", {"model": model, "path": path})

    def with_(self, path: str, value: Any) -> SweepBuilder:
        return self._set(path, value)

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


class EndpointBuilder:
    """An OnlineEndpoint: ``EndpointBuilder("birds", "ns").model("pytorch-birds", 2).obj()``."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "OnlineEndpoint",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"uri": "model://pytorch-birds/1"},
                "environment": "pytorch",
                "source": {"configMap": "birds-score"},
                "entryScript": "pytorch_score.py",
            },
        }

    def set(self, path: str, value: Any) -> EndpointBuilder:
        node = self._obj
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
        return self

    def model(self, name: str, version: int) -> EndpointBuilder:
        return self.set("spec.model", {"uri": f"model://{name}/{version}"})

    def sweep(self, name: str) -> EndpointBuilder:
        return self.set("spec.model", {"sweep": name})

    def traffic(self, **percents: int) -> EndpointBuilder:
        return self.set("spec.traffic", {k.lstrip("v"): p for k, p in percents.items()})

    def replicas(self, n: int) -> EndpointBuilder:
        return self.set("spec.replicas", n)

    def public(self) -> EndpointBuilder:
        return self.set("spec.public", True)

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def environment(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec or {"image": "python:3.11-slim"},
    }


def model_version(name: str, namespace: str, model: str, version: int) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": model,
            "version": version,
            "run": {"name": "some-run"},
            "files": [{"path": "model.pt", "size": 3, "sha256": "a" * 64}],
            "totalBytes": 3,
            "size": "3 B",
        },
    }


def pod(
    run: str,
    node: int,
    *,
    phase: str = "Pending",
    node_name: str | None = None,
    gated: bool = False,
    exit_code: int | None = None,
    message: str = "",
    reason: str | None = None,
    pod_reason: str | None = None,
    finished_at: str = "2026-01-01T12:00:00Z",
    waiting: str | None = None,
    attempt: int = 0,
) -> dict[str, Any]:
    """An observed node Pod of ``run`` in the given state (for status tables)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{run}-{node}",
            "namespace": "default",
            "labels": {
                "torchyard.dev/run": run,
                "torchyard.dev/node-rank": str(node),
                "torchyard.dev/attempt": str(attempt),
            },
        },
        "spec": {"containers": [{"name": "trainer"}]},
        "status": {"phase": phase},
    }
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": "torchyard.dev/gang"}]
    if node_name:
        obj["spec"]["nodeName"] = node_name
    if pod_reason:
        obj["status"]["reason"] = pod_reason
    state: dict[str, Any] = {}
    if exit_code is not None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason or "Error",
                "message": message,
                "finishedAt": finished_at,
            }
        }
    elif waiting:
        state = {"waiting": {"reason": waiting, "message": message}}
    elif phase == "Running":
        state = {"running": {}}
    obj["status"]["containerStatuses"] = [{"name": "trainer", "state": state}]
    return obj


def role_binding(namespace: str, name: str, role: str, service_account: str) -> dict[str, Any]:
    """A RoleBinding of a Role in ``namespace`` to one of its ServiceAccounts."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def wheel(folder: Path, name: str, version: str, module: str, script: str) -> Path:
    """A pure-Python wheel made by hand (offline): package ``name`` whose ``__init__`` is
    ``module``, and one console script ``script`` (``"cmd = pkg:func"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: torchyard-test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{script}\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            data = text.encode()
            zf.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{member},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path

"""Property: any TrainingRun a user can write, valid or not, ends either refused by the
apiserver with a message, or admitted and reconciled by the operator (its status says
so), and the operator never crashes. At least 500 generated specs go through the real
apiserver while the operator runs; the CRD's rules and the Python models must agree."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import environment
from tests.conftest import InProcessOperator
from tests.integration.helpers import wait_for, wait_status
from torchyard import api, k8s

EXAMPLES = 500
_names = itertools.count()

# Valid building blocks ...
distributions = st.fixed_dictionaries(
    {},
    optional={
        "type": st.just("pytorch"),
        "nodeCount": st.integers(1, 4),
        "processCountPerNode": st.integers(1, 2),
        "launch": st.sampled_from(["process", "node"]),
        "masterPort": st.sampled_from([1024, 6105, 29500, 65535]),
    },
)
resources = st.fixed_dictionaries(
    {},
    optional={
        "gpusPerNode": st.sampled_from([0, 2, 4]),
        "cpu": st.sampled_from(["500m", "8", "1.5"]),
        "memory": st.sampled_from(["64Gi", "1G", "0.5Ti"]),
        "shmSize": st.sampled_from(["16Gi", "1Gi"]),
    },
)
valid_specs = st.fixed_dictionaries(
    {
        "environment": st.sampled_from(["pytorch", "missing"]),
        "command": st.sampled_from([["python", "train.py"], ["torchrun", "t.py", "--lr", "0.1"]]),
    },
    optional={
        "source": st.sampled_from(
            [{"image": True}, {"configMap": "src"}, {"git": {"url": "https://git.example/x.git"}}]
        ),
        "distribution": distributions,
        "resources": resources,
        "compute": st.fixed_dictionaries(
            {},
            optional={
                "pool": st.sampled_from(["a100", "cpu", "h100"]),
                "tolerations": st.just([{"key": "k", "operator": "Exists"}]),
            },
        ),
        "policy": st.fixed_dictionaries(
            {},
            optional={
                "backoffLimit": st.integers(0, 3),
                "platformRestartLimit": st.integers(0, 3),
                "ttlSecondsAfterFinished": st.just(60),
            },
        ),
        "env": st.just([{"name": "NCCL_DEBUG", "value": "INFO"}]),
        "outputs": st.fixed_dictionaries(
            {},
            optional={
                "optional": st.booleans(),
                "register": st.fixed_dictionaries(
                    {"model": st.just("birds")},
                    optional={
                        "path": st.sampled_from(["outputs", "outputs/model.pt", "outputs/a..b"])
                    },
                ),
            },
        ),
        "serviceAccountName": st.sampled_from(["default", "trainer"]),
        "automountServiceAccountToken": st.booleans(),
    },
)

# ... and one mistake a user could make, applied to half of them.
MISTAKES: list[tuple[str, Any]] = [
    ("distribution.nodeCount", 0),
    ("distribution.nodeCount", 5000),
    ("distribution.processCountPerNode", 0),
    ("distribution.type", "mpi"),
    ("distribution.launch", "mpirun"),
    ("distribution.masterPort", 80),
    ("distribution.masterPort", 70000),
    ("resources.gpusPerNode", -1),
    ("resources.cpu", "lots"),
    ("resources.memory", "huge"),
    ("resources.memory", "-1Gi"),
    ("resources.shmSize", "128Gi"),  # refused only where memory is smaller
    ("resources.shmSize", "1e1.5"),
    ("outputs.register", {"model": "birds", "path": "/etc/passwd"}),
    ("outputs.register", {"model": "birds", "path": "outputs/../../x"}),
    ("outputs.register", {"model": "birds", "path": "%2e%2e/x"}),
    ("serviceAccountName", "Bad_SA"),
    ("serviceAccountName", ""),
    ("policy.platformRestartLimit", -1),
    ("source", {}),
    ("source", {"image": True, "configMap": "src"}),
    ("source", {"image": False}),
    ("source", {"configMap": "Bad_Name"}),
    ("environment", ""),
    ("environment", "Bad_Env"),
    ("command", []),
    ("compute.pool", "Bad_Pool"),
    ("compute.tolerations", [{"operator": "Sometimes"}]),
    ("policy.backoffLimit", -1),
    ("env", [{"name": "RANK", "value": "0"}]),
    ("env", [{"name": "1BAD"}]),
    ("unknownField", 1),
    ("distribution.gpus", 2),
]


def with_mistake(spec: dict[str, Any], mistake: tuple[str, Any] | None) -> dict[str, Any]:
    if mistake is None:
        return spec
    path, value = mistake
    node = spec
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return spec


specs = st.builds(with_mistake, valid_specs, st.one_of(st.none(), st.sampled_from(MISTAKES)))


def test_generated_specs_are_refused_with_a_message_or_reconciled(
    cluster: object,
    operator: InProcessOperator,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    k8s.create(environment("pytorch", namespace, image="img"))
    accepted: list[str] = []
    refused: list[str] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(spec=specs, long_name=st.booleans())
    def send(spec: dict[str, Any], long_name: bool) -> None:
        name = f"gen-{next(_names)}" + ("-x" * 30 if long_name else "")
        body = {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        try:
            api.parse_trainingrun(body)
            valid = True
        except api.InvalidSpec:
            valid = False
        try:
            k8s.create(body)
        except k8s.ApiError as err:
            assert err.status in (400, 422), err
            assert err.message, "refused without a message"
            refused.append(name)
            assert not valid, f"the apiserver refused what the models accept: {err.message}"
            return
        assert valid, f"the apiserver accepted what the models refuse: {spec}"
        accepted.append(name)

    send()
    assert len(accepted) + len(refused) >= EXAMPLES
    assert accepted and refused
    for name in accepted:
        wait_status(
            k8s.TRAININGRUNS,
            namespace,
            name,
            lambda s: s.get("observedGeneration") == 1 and s.get("phase"),
            timeout=120,
        )
    assert operator.thread is not None and operator.thread.is_alive()
    errors = [
        r for r in caplog.records if r.name.startswith("torchyard") and r.levelno >= logging.ERROR
    ]
    assert not errors, errors[0].getMessage()
    print(f"\n{len(accepted)} accepted and reconciled, {len(refused)} refused with a message")
    wait_for("cleanup", lambda: True)

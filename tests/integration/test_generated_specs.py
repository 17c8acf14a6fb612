"""Property: any TrainingRun a user can write, valid or not, is either refused by the
apiserver with a message, or accepted and, within 10 s of its creation, given a status by
the operator: a phase, and, where the run cannot go on, a False condition whose message
names the field that stops it (an Environment, ConfigMap, claim, PriorityClass, Kueue
queue or ServiceAccount that does not exist: the run waits for it), or Failed with reason
InvalidSpec and the apiserver's words when the apiserver refuses one of its children. No
accepted run is left without a status, none is retried in silence, the operator never
crashes, and the CRD's rules and the Python models agree. At least 500 generated specs go
through the real apiserver while the operator runs.

The cases of issue 29 are tested one by one below, each class with several values:
refused by the apiserver naming the field (a nodeSelector that is no label, a file:// or
local git URL, too little memory, a NUL byte in an argument), reported by the operator
naming the field and gone on with once the object appears (a missing ConfigMap, claim,
PriorityClass, Kueue queue), and failed at once (a child the apiserver finds invalid)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.helpers import local_queue, stand_in_kueue, wait_for, wait_status
from torchyard import api, k8s

EXAMPLES = 500
# The seconds an accepted run has from its creation to its first status.
STATUS_WITHIN = 10
_names = itertools.count()

# Objects the generated specs name: these exist (made by the test), the NO_SUCH ones not.
SOURCE, CLAIM, PRIORITY = "src", "ckpt", "torchyard-generated-high"
NO_SUCH_SOURCE, NO_SUCH_CLAIM, NO_SUCH_PRIORITY = "no-such-src", "no-such-claim", "no-such-high"

# Tolerations the CRD lets through and the Pod validation refuses (422): the run fails
# at once, InvalidSpec, with the apiserver's message naming spec.compute.tolerations.
POD_INVALID_TOLERATIONS: list[list[dict[str, Any]]] = [
    [{"key": "k", "operator": "Exists", "value": "v"}],
    [{"key": "bad key", "operator": "Exists"}],
    [{"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 5}],
]

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
        "memory": st.sampled_from(["64Gi", "1G", "0.5Ti", "32Mi"]),
        "shmSize": st.sampled_from(["16Gi", "1Gi"]),
    },
)
valid_specs = st.fixed_dictionaries(
    {
        "environment": st.sampled_from(["pytorch", "pytorch", "pytorch", "missing"]),
        "command": st.sampled_from([["python", "train.py"], ["torchrun", "t.py", "--lr", "0.1"]]),
    },
    optional={
        "source": st.sampled_from(
            [
                {"image": True},
                {"configMap": SOURCE},
                {"configMap": NO_SUCH_SOURCE},
                {"git": {"url": "https://git.example/x.git"}},
                {"git": {"url": "git@git.example:team/x.git", "revision": "v1"}},
            ]
        ),
        "distribution": distributions,
        "resources": resources,
        "compute": st.fixed_dictionaries(
            {},
            optional={
                "pool": st.sampled_from(["a100", "cpu", "h100"]),
                "tolerations": st.sampled_from(
                    [[{"key": "k", "operator": "Exists"}], *POD_INVALID_TOLERATIONS]
                ),
                "nodeSelector": st.sampled_from(
                    [{"disktype": "ssd"}, {"topology.kubernetes.io/zone": "z-1", "e": ""}]
                ),
                "priorityClassName": st.sampled_from([PRIORITY, NO_SUCH_PRIORITY]),
            },
        ),
        "checkpoints": st.sampled_from(
            [{"claimName": CLAIM}, {"claimName": NO_SUCH_CLAIM}, {"size": "1Gi"}]
        ),
        "scheduling": st.fixed_dictionaries({}, optional={"queueName": st.just("team-a")}),
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
        "serviceAccountName": st.sampled_from(["default", "default", "trainer"]),
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
    ("resources.memory", "1Ki"),
    ("resources.memory", "0"),
    ("resources.memory", "31Mi"),
    ("resources.memory", "1M"),
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
    ("source", {"git": {"url": "file:///srv/repo.git"}}),
    ("source", {"git": {"url": "/srv/repo.git"}}),
    ("source", {"git": {"url": "ext::sh -c id"}}),
    ("source", {"git": {"url": "https://git.example/x.git", "revision": "main\x00"}}),
    ("environment", ""),
    ("environment", "Bad_Env"),
    ("command", []),
    ("command", ["python", "train.py", "--tag", "a\x00b"]),
    ("command", ["\x00"]),
    ("env", [{"name": "RANK", "value": "0"}]),
    ("env", [{"name": "1BAD"}]),
    ("env", [{"name": "TAG", "value": "x\x00"}]),
    ("compute.pool", "Bad_Pool"),
    ("compute.tolerations", [{"operator": "Sometimes"}]),
    *[("compute.tolerations", t) for t in POD_INVALID_TOLERATIONS],
    ("compute.nodeSelector", {"gpu": "a b"}),
    ("compute.nodeSelector", {"gpu": "-a100"}),
    ("compute.nodeSelector", {"gpu": "x" * 64}),
    ("compute.nodeSelector", {"bad key": "x"}),
    ("compute.nodeSelector", {"a/b/c": "x"}),
    ("compute.nodeSelector", {"example.com/" + "g" * 64: "x"}),
    ("compute.priorityClassName", "Bad_Priority"),
    ("checkpoints", {"size": "0"}),
    ("checkpoints", {"claimName": "Bad_Claim"}),
    ("scheduling.queueName", "Bad_Queue"),
    ("policy.backoffLimit", -1),
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


# -- what the status of an accepted spec must say -----------------------------------------


def waits_for(spec: dict[str, Any]) -> list[str]:
    """The fields whose objects are missing, which the status must name (all of them; the
    Environment is looked at first, the ServiceAccount only once the Pods are created)."""
    if spec["environment"] == "missing":
        return ["spec.environment"]
    missing = []
    if spec.get("source", {}).get("configMap") == NO_SUCH_SOURCE:
        missing.append("spec.source.configMap")
    if spec.get("checkpoints", {}).get("claimName") == NO_SUCH_CLAIM:
        missing.append("spec.checkpoints.claimName")
    if spec.get("compute", {}).get("priorityClassName") == NO_SUCH_PRIORITY:
        missing.append("spec.compute.priorityClassName")
    if spec.get("scheduling", {}).get("queueName"):  # no Kueue, or no such LocalQueue
        missing.append("spec.scheduling.queueName")
    if not missing and spec.get("serviceAccountName") == "trainer":
        missing.append("spec.serviceAccountName")
    return missing


def says_what_it_should(spec: dict[str, Any], status: dict[str, Any]) -> bool:
    """``status`` is the one ``spec`` deserves: waiting with the missing fields named,
    Failed/InvalidSpec for Pods the apiserver refuses, else on its way (Queued or on)."""
    if status.get("observedGeneration") != 1 or not status.get("phase"):
        return False
    phase = status["phase"]
    missing = waits_for(spec)
    if missing:
        return phase in ("Preparing", "Pending") and any(
            c["status"] == "False" and all(f in c.get("message", "") for f in missing)
            for c in status.get("conditions", [])
            if c["type"] in ("EnvironmentReady", "Admitted")
        )
    if spec.get("compute", {}).get("tolerations") in POD_INVALID_TOLERATIONS:
        failure = status.get("failure") or {}
        return (
            phase == "Failed"
            and failure.get("reason") == "InvalidSpec"
            and "spec.compute.tolerations" in failure.get("message", "")
        )
    return phase in ("Queued", "Running", "Succeeded")


def first_status_seconds(run: dict[str, Any]) -> float:
    """Seconds from the run's creation to its first status write (the oldest condition
    transition still held: ``Accepted`` keeps the first write's time while it holds)."""
    created = _time(run["metadata"]["creationTimestamp"])
    written = min(_time(c["lastTransitionTime"]) for c in run["status"]["conditions"])
    return (written - created).total_seconds()


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")


def make_named_objects(namespace: str) -> None:
    """The ConfigMap, claim and PriorityClass the generated specs name and find."""
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SOURCE, "namespace": namespace},
            "data": {"train.py": "print('hi')\n"},
        }
    )
    k8s.create(claim(namespace, CLAIM))
    try:
        k8s.create(priority_class(PRIORITY))
    except k8s.ApiError as err:
        if not err.conflict:  # left by an earlier session: the same object
            raise


def claim(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def priority_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 100,
    }


def retried_in_silence(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The operator's lines that say a reconcile failed and is retried with backoff."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("torchyard") and "retrying with backoff" in r.getMessage()
    ]


def test_generated_specs_are_refused_with_a_message_or_say_within_10s_what_stops_them(
    cluster: Cluster,
    operator: InProcessOperator,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    k8s.create(environment("pytorch", namespace, image="img"))
    make_named_objects(namespace)
    accepted: dict[str, dict[str, Any]] = {}
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
        accepted[name] = spec

    try:
        send()
        assert len(accepted) + len(refused) >= EXAMPLES
        assert accepted and refused
        # Every kind of outcome is among them, not only the easy one.
        outcomes = {
            "waits": sum(1 for s in accepted.values() if waits_for(s)),
            "pods refused": sum(
                1
                for s in accepted.values()
                if not waits_for(s)
                and s.get("compute", {}).get("tolerations") in POD_INVALID_TOLERATIONS
            ),
        }
        outcomes["goes on"] = len(accepted) - sum(outcomes.values())
        assert all(outcomes.values()), outcomes

        pending = dict(accepted)
        last: dict[str, dict[str, Any]] = {}

        def all_say_what_they_should() -> bool:
            for run in k8s.list_(k8s.TRAININGRUNS, namespace):
                name = run["metadata"]["name"]
                last[name] = run
                if name in pending and says_what_it_should(pending[name], run.get("status") or {}):
                    del pending[name]
            return not pending

        try:
            wait_for("every accepted run's status", all_say_what_they_should, timeout=120)
        except AssertionError:
            shown = [(n, pending[n], last.get(n, {}).get("status")) for n in list(pending)[:3]]
            raise AssertionError(
                f"{len(pending)} runs do not say what they should: {shown}"
            ) from None
        slow = {
            name: seconds
            for name in accepted
            if (seconds := first_status_seconds(last[name])) > STATUS_WITHIN
        }
        assert not slow, f"first status later than {STATUS_WITHIN}s after creation: {slow}"
        assert not retried_in_silence(caplog), retried_in_silence(caplog)[:3]
        assert operator.thread is not None and operator.thread.is_alive()
        errors = [
            r
            for r in caplog.records
            if r.name.startswith("torchyard") and r.levelno >= logging.ERROR
        ]
        assert not errors, errors[0].getMessage()
        print(
            f"\n{len(accepted)} accepted ({outcomes}), each with a status within "
            f"{STATUS_WITHIN}s; {len(refused)} refused with a message"
        )
    finally:
        k8s.delete(k8s.PRIORITYCLASSES, None, PRIORITY)


# -- the named cases, each class with several values ---------------------------------------

# Refused by the apiserver, naming the field.
REFUSED_BY_THE_APISERVER: list[tuple[str, Any, str]] = [
    ("spec.compute.nodeSelector", {"gpu": "a b"}, "spec.compute.nodeSelector.gpu"),
    ("spec.compute.nodeSelector", {"gpu": "a100/80gb"}, "spec.compute.nodeSelector.gpu"),
    ("spec.compute.nodeSelector", {"gpu": "x" * 64}, "spec.compute.nodeSelector.gpu"),
    ("spec.compute.nodeSelector", {"gpu type": "a100"}, "spec.compute.nodeSelector"),
    ("spec.compute.nodeSelector", {"Example.com/gpu": "a100"}, "spec.compute.nodeSelector"),
    ("spec.source", {"git": {"url": "file:///srv/repo.git"}}, "spec.source.git.url"),
    ("spec.source", {"git": {"url": "/srv/repo.git"}}, "spec.source.git.url"),
    ("spec.source", {"git": {"url": "../repo"}}, "spec.source.git.url"),
    ("spec.source", {"git": {"url": "ext::sh -c id"}}, "spec.source.git.url"),
    ("spec.resources.memory", "1Ki", "spec.resources.memory"),
    ("spec.resources.memory", "0", "spec.resources.memory"),
    ("spec.resources.memory", "1048576", "spec.resources.memory"),
    ("spec.resources.memory", "31Mi", "spec.resources.memory"),
    ("spec.command", ["python", "train.py", "--tag", "a\x00b"], "spec.command[3]"),
    ("spec.command", ["\x00"], "spec.command[0]"),
    ("spec.env", [{"name": "TAG", "value": "a\x00"}], "spec.env[0].value"),
    ("spec.checkpoints", {"size": "0"}, "spec.checkpoints.size"),
]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    REFUSED_BY_THE_APISERVER,
    ids=[f"{p}={v!r}"[:60] for p, v, _ in REFUSED_BY_THE_APISERVER],
)
def test_a_static_mistake_is_refused_by_the_apiserver_naming_the_field(
    cluster: Cluster, namespace: str, path: str, value: Any, field: str
) -> None:
    body = TrainingRunBuilder("bad", namespace).with_(path, value).obj()
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(body)
    assert err.value.status == 422, err.value
    assert field in err.value.message, err.value.message
    with pytest.raises(api.InvalidSpec):  # the models say the same
        api.parse_trainingrun(body)


def named_waits(ns: str) -> list[tuple[str, str, Any, str, Callable[[], object]]]:
    """(run, spec path, its value, the reason, what makes the object appear): several
    missing objects per kind."""

    def config_map(name: str) -> Callable[[], object]:
        return lambda: k8s.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}
        )

    def pvc(name: str) -> Callable[[], object]:
        return lambda: k8s.create(claim(ns, name))

    def priority(name: str) -> Callable[[], object]:
        return lambda: k8s.create(priority_class(name))

    def queue(name: str) -> Callable[[], object]:
        return lambda: local_queue(ns, name)

    high = f"{ns}-high"[:253]
    return [
        ("cm-a", "spec.source", {"configMap": "late-src"}, "ConfigMapNotFound",
         config_map("late-src")),
        ("cm-b", "spec.source", {"configMap": "a.b"}, "ConfigMapNotFound", config_map("a.b")),
        ("pvc-a", "spec.checkpoints", {"claimName": "late-ckpt"},
         "PersistentVolumeClaimNotFound", pvc("late-ckpt")),
        ("pvc-b", "spec.checkpoints", {"claimName": "c" * 63},
         "PersistentVolumeClaimNotFound", pvc("c" * 63)),
        ("pc-a", "spec.compute.priorityClassName", high, "PriorityClassNotFound", priority(high)),
        ("pc-b", "spec.compute.priorityClassName", f"{high}.b", "PriorityClassNotFound",
         priority(f"{high}.b")),
        ("q-a", "spec.scheduling.queueName", "team-a", "KueueNotInstalled", queue("team-a")),
        ("q-b", "spec.scheduling.queueName", "team-b", "KueueNotInstalled", queue("team-b")),
    ]  # fmt: skip


def test_a_missing_object_is_reported_by_field_within_10s_and_the_run_goes_on_when_it_appears(
    cluster: Cluster, env: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ns = env
    kueue_there = k8s.get_or_none(k8s.CRDS, None, k8s.LOCALQUEUES_CRD) is not None
    cases = named_waits(ns)
    for name, path, value, _, _ in cases:
        k8s.create(TrainingRunBuilder(name, ns).environment("pytorch").with_(path, value).obj())
    started = time.monotonic()
    for name, path, value, reason, _ in cases:
        if reason == "KueueNotInstalled" and kueue_there:  # Kueue's own CRD from test_kueue
            reason = "LocalQueueNotFound"
        field = path if isinstance(value, str) else f"{path}.{next(iter(value))}"
        left = max(0.5, STATUS_WITHIN - (time.monotonic() - started))

        def says(status: dict[str, Any], reason: str = reason) -> bool:
            return any(
                c["type"] == "Admitted" and c["status"] == "False" and c["reason"] == reason
                for c in status.get("conditions", [])
            )

        waiting = wait_status(k8s.TRAININGRUNS, ns, name, says, timeout=left)
        admitted = next(c for c in waiting["status"]["conditions"] if c["type"] == "Admitted")
        assert waiting["status"]["phase"] == "Pending"
        assert admitted["message"].startswith(f"{field}: "), admitted["message"]
        assert admitted["message"].endswith("the run waits for it"), admitted["message"]
        assert not k8s.list_(k8s.PODS, ns, label_selector=f"torchyard.dev/run={name}")

    with stand_in_kueue():
        try:
            for _, _, _, _, appear in cases:
                appear()
            for name, *_ in cases:  # looked at again every refusals.WAIT_SECONDS
                wait_status(
                    k8s.TRAININGRUNS,
                    ns,
                    name,
                    lambda s: s.get("phase") in ("Queued", "Running"),
                    timeout=40,
                )
        finally:
            for _, path, value, *_ in cases:
                if path == "spec.compute.priorityClassName":
                    k8s.delete(k8s.PRIORITYCLASSES, None, str(value))
            for name, *_ in cases:  # before the stand-in CRD goes
                k8s.delete(k8s.TRAININGRUNS, ns, name)
    assert not retried_in_silence(caplog), retried_in_silence(caplog)[:3]


@pytest.mark.parametrize(
    "tolerations", POD_INVALID_TOLERATIONS, ids=[str(t) for t in POD_INVALID_TOLERATIONS]
)
def test_a_child_the_apiserver_refuses_fails_the_run_at_once_with_its_message(
    cluster: Cluster, env: str, caplog: pytest.LogCaptureFixture, tolerations: list[Any]
) -> None:
    caplog.set_level(logging.WARNING)
    ns = env
    run = TrainingRunBuilder("refused", ns).environment("pytorch").nodes(2).pool("cpu")
    k8s.create(run.with_("spec.compute.tolerations", tolerations).obj())
    failed = wait_status(
        k8s.TRAININGRUNS, ns, "refused", lambda s: s.get("phase") == "Failed", STATUS_WITHIN
    )["status"]
    failure = failed["failure"]
    assert failure["reason"] == "InvalidSpec"
    assert 'Pod "refused-' in failure["message"] and "is invalid" in failure["message"]
    assert "(from spec.compute.tolerations)" in failure["message"]
    assert not k8s.list_(k8s.PODS, ns, label_selector="torchyard.dev/run=refused")
    assert not retried_in_silence(caplog), retried_in_silence(caplog)[:3]

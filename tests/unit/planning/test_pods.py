"""The node Pods and the headless Service, built purely from the spec."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.planning import pods


def run_on_a100() -> api.TrainingRun:
    body = (
        TrainingRunBuilder("bert", "vision")
        .nodes(2)
        .procs(2)
        .gpus(2)
        .pool("a100")
        .with_("spec.resources.cpu", "8")
        .with_("spec.resources.memory", "64Gi")
        .with_("spec.resources.shmSize", "16Gi")
        .source(configMap="bert-src")
        .obj()
    )
    body["metadata"]["uid"] = "uid-1"
    return api.parse_trainingrun(body)


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}


def test_service_is_headless_and_publishes_not_ready_addresses() -> None:
    svc = pods.service(run_on_a100())
    assert svc["metadata"]["name"] == "bert"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(
    ("distribution", "selector"),
    [
        # PyTorch: only MASTER_ADDR (node 0) is looked up, so the Service selects node 0
        # alone and its Endpoints do not change with every Pod of the gang as it starts
        ({"type": "pytorch"}, {"torchyard.dev/run": "bert", "torchyard.dev/node-rank": "0"}),
        (
            {"type": "none", "nodeCount": 1, "processCountPerNode": 1},
            {"torchyard.dev/run": "bert", "torchyard.dev/node-rank": "0"},
        ),
        # MPI's hostfile names every node Pod: each needs its DNS name
        ({"type": "mpi", "processCountPerNode": 2}, {"torchyard.dev/run": "bert"}),
    ],
)
def test_the_service_names_the_node_pods_the_distribution_type_looks_up(
    distribution: dict[str, Any], selector: dict[str, str]
) -> None:
    body = TrainingRunBuilder("bert", "vision").nodes(2).obj()
    body["spec"]["distribution"].update(distribution)
    run = api.parse_trainingrun(body)
    assert pods.service(run)["spec"]["selector"] == selector
    node0 = pods.pod(run, 0, image="img")["metadata"]["labels"]
    assert selector.items() <= node0.items()  # node 0 always has its DNS name


def test_pod_names_dns_and_ownership() -> None:
    p = pods.pod(run_on_a100(), 1, image="img")
    assert p["metadata"]["name"] == "bert-1"
    assert (p["spec"]["hostname"], p["spec"]["subdomain"]) == ("bert-1", "bert")
    assert p["metadata"]["labels"]["torchyard.dev/node-rank"] == "1"
    owner = p["metadata"]["ownerReferences"][0]
    assert owner["controller"] is True and owner["kind"] == "TrainingRun"
    assert p["spec"]["restartPolicy"] == "Never"
    assert p["spec"]["enableServiceLinks"] is False


def test_pod_resources_pool_and_gpu_toleration() -> None:
    p = pods.pod(run_on_a100(), 0, image="img")
    trainer = p["spec"]["containers"][0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert trainer["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert p["spec"]["nodeSelector"] == {"torchyard.dev/pool": "a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
        "tolerations"
    ]
    shm = next(v for v in p["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_pod_runs_the_launcher_with_the_rank_contract() -> None:
    p = pods.pod(run_on_a100(), 1, image="img", python="python3.11")
    trainer = p["spec"]["containers"][0]
    # the launcher, from the shipped package folder, copies the ConfigMap's code first
    assert trainer["command"] == [
        "python3.11",
        "/torchyard/lib/torchyard/launch/main.py",
        "--copy",
        "/torchyard/source",
        "/workspace",
        "--",
        "python",
        "train.py",
    ]
    env = env_of(p)
    assert env["MASTER_ADDR"] == "bert-0.bert.vision.svc"
    assert env["NODE_RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["TORCHYARD_OUTPUTS"] == "/workspace/outputs"
    assert env["TORCHYARD_SHIPPED_PATH"] == "/torchyard/lib"
    assert "initContainers" not in p["spec"]  # no container start of its own
    mounts = {m["name"]: m for m in trainer["volumeMounts"]}
    assert mounts["source"] == {
        "name": "source",
        "mountPath": "/torchyard/source",
        "readOnly": True,
    }
    assert trainer["workingDir"] == "/workspace"


def test_pods_are_gated_until_admitted_and_ungate_removes_only_the_gate() -> None:
    p = pods.pod(run_on_a100(), 0, image="img")
    assert p["spec"]["schedulingGates"] == [{"name": "torchyard.dev/gang"}]
    open_ = pods.ungate(p)
    assert "schedulingGates" not in open_["spec"]
    assert {k: v for k, v in open_["spec"].items()} == {
        k: v for k, v in p["spec"].items() if k != "schedulingGates"
    }


def test_kueue_pod_groups_replace_gating() -> None:
    """The fallback of a Kueue without Workload v1beta2: plain Pod groups, Kueue's gate."""
    body = TrainingRunBuilder("r").nodes(3).with_("spec.scheduling.queueName", "team-a").obj()
    p = pods.pod(api.parse_trainingrun(body), 0, image="img", pod_group=True)
    assert "schedulingGates" not in p["spec"]
    assert p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "r-0"
    assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
    # One group per attempt: Kueue waits for no replacement Pods in it (the real Kueue
    # would keep the stopped Pods' finalizers: tests/integration/test_kueue.py).
    assert p["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] == "false"


def test_a_pod_of_a_workload_kueue_admitted_carries_no_kueue_pod_group() -> None:
    """Through a Workload the Pods are created once admitted: no gate, no Pod group."""
    body = TrainingRunBuilder("r").nodes(3).with_("spec.scheduling.queueName", "team-a").obj()
    p = pods.pod(api.parse_trainingrun(body), 0, image="img", gated=False)
    assert "schedulingGates" not in p["spec"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in p["metadata"]["labels"])
    assert not any(k.startswith("kueue.x-k8s.io/") for k in p["metadata"].get("annotations", {}))


def test_ungate_adds_the_domain_and_tolerations_of_an_admission() -> None:
    p = pods.pod(run_on_a100(), 1, image="img")
    opened = pods.ungate(p, {"example.com/rack": "r2"}, [{"key": "spot", "operator": "Exists"}])
    assert "schedulingGates" not in opened["spec"]
    assert opened["spec"]["nodeSelector"] == {
        **p["spec"]["nodeSelector"],
        "example.com/rack": "r2",
    }
    assert opened["spec"]["tolerations"][-1] == {"key": "spot", "operator": "Exists"}
    assert opened["spec"]["tolerations"][:-1] == p["spec"]["tolerations"]


def test_builders_are_deterministic() -> None:
    assert pods.pods(run_on_a100(), image="img") == pods.pods(run_on_a100(), image="img")


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_every_container_meets_pod_security_restricted_but_the_image_picks_its_user() -> None:
    sources: list[dict[str, Any]] = [
        {"configMap": "bert-src"},
        {"git": {"url": "https://example.com/r.git", "revision": "main"}},
        {"image": True},
    ]
    for source in sources:
        body = TrainingRunBuilder("bert", "vision").nodes(2).source(**source).obj()
        p = pods.pod(api.parse_trainingrun(body), 0, image="img")
        spec = p["spec"]
        assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        containers = spec.get("initContainers", []) + spec["containers"]
        assert [c["name"] for c in spec["containers"]] == ["trainer"]
        for container in containers:
            assert container["securityContext"] == RESTRICTED_CONTAINER, (source, container)
            # Curated PyTorch images may run as root: no runAsNonRoot/runAsUser is forced.
            assert "runAsNonRoot" not in container["securityContext"]
        assert "runAsNonRoot" not in spec["securityContext"]
        assert not any(key in v for v in spec["volumes"] for key in ("hostPath", "hostPathType")), (
            spec["volumes"]
        )


def test_run_as_user_makes_the_node_pods_non_root_with_writable_volumes() -> None:
    body = TrainingRunBuilder("bert", "vision").source(configMap="src").obj()
    body["spec"]["runAsUser"] = 1000
    spec = pods.pod(api.parse_trainingrun(body), 0, image="img")["spec"]
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
    }
    body["spec"]["runAsUser"] = 0
    with pytest.raises(api.InvalidSpec, match="runAsUser"):
        api.parse_trainingrun(body)


def test_the_environments_python_runs_the_shipped_launcher_and_fetches_the_source() -> None:
    # An Environment whose interpreter is /opt/conda/bin/python runs the launcher, which
    # puts the source in place itself: no init container, whatever the source but git.
    expected = {
        "configMap": ["--copy", "/torchyard/source", "/workspace"],
        "image": [],
        "snapshot": ["--fetch", "a" * 64, "/workspace"],
    }
    for source in ({"configMap": "src"}, {"image": True}, {"snapshot": "a" * 64}):
        body = TrainingRunBuilder("bert", "vision").source(**source).obj()
        p = pods.pod(
            api.parse_trainingrun(body),
            0,
            image="img",
            python="/opt/conda/bin/python",
            settings=pods.Settings(registry_url="http://registry:8080"),
        )
        assert "initContainers" not in p["spec"], source
        [kind] = source
        trainer = p["spec"]["containers"][0]
        assert trainer["command"] == [
            "/opt/conda/bin/python",
            "/torchyard/lib/torchyard/launch/main.py",
            *expected[kind],
            "--",
            "python",
            "train.py",
        ]
        mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
        assert mounts["torchyard"] == "/torchyard/lib/torchyard"
        if kind == "snapshot":  # what the download needs, in the trainer's own env
            env = env_of(p)
            assert env["TORCHYARD_NAMESPACE"] == "vision"
            assert env["TORCHYARD_REGISTRY_TOKEN_FILE"].endswith("/token")
            assert mounts["registry-token"] == "/var/run/secrets/torchyard/registry"


def test_a_git_source_keeps_its_clone_init_container_only() -> None:
    body = (
        TrainingRunBuilder("bert", "vision")
        .source(git={"url": "https://example.com/r.git", "revision": "v1", "path": "sub"})
        .obj()
    )
    p = pods.pod(api.parse_trainingrun(body), 0, image="img")
    [clone] = p["spec"]["initContainers"]
    assert clone["name"] == "git-clone" and clone["image"] == pods.Settings().git_image
    trainer = p["spec"]["containers"][0]
    assert trainer["command"][:3] == ["python3", "/torchyard/lib/torchyard/launch/main.py", "--"]


def test_the_shipped_modules_are_mounted_from_their_content_addressed_config_map() -> None:
    assert pods.SHIPPED_MODULES[0] == "launch"
    p = pods.pod(run_on_a100(), 0, image="img")
    [volume] = [v for v in p["spec"]["volumes"] if v["name"] == "torchyard"]
    config_map = pods.launcher_config_map("vision")
    items = volume["configMap"].pop("items")
    assert volume["configMap"] == {"name": config_map["metadata"]["name"], "defaultMode": 0o444}
    # every key of the ConfigMap, at its path in the package folder
    assert sorted(item["key"] for item in items) == sorted(config_map["data"])
    paths = {item["path"] for item in items}
    assert {"__init__.py", "launch/__init__.py", "launch/main.py", "checkpoint.py"} <= paths
    assert paths == set(pods.shipped_files())


def test_node_pods_run_as_the_runs_service_account_without_an_api_token() -> None:
    settings = pods.Settings(registry_url="http://registry:8080")
    spec = pods.pod(run_on_a100(), 0, image="img", settings=settings)["spec"]
    assert spec["serviceAccountName"] == "default"
    assert spec["automountServiceAccountToken"] is False
    # The registry token (what the launcher archives with) stays, whatever the setting.
    [token] = [v for v in spec["volumes"] if v["name"] == "registry-token"]
    projected = token["projected"]["sources"][0]["serviceAccountToken"]
    assert projected["audience"] == "torchyard-registry"

    body = TrainingRunBuilder("bert", "vision").obj()
    body["spec"].update(serviceAccountName="trainer", automountServiceAccountToken=True)
    spec = pods.pod(api.parse_trainingrun(body), 0, image="img", settings=settings)["spec"]
    assert spec["serviceAccountName"] == "trainer"
    assert spec["automountServiceAccountToken"] is True


@pytest.mark.parametrize(
    ("memory", "shm", "size"),
    [
        (None, None, "1Gi"),
        ("64Gi", None, "32Gi"),
        ("1G", None, "500M"),
        ("0.5Ti", None, "256Gi"),
        ("33Mi", None, "16896Ki"),
        ("64Gi", "16Gi", "16Gi"),
        ("2Gi", "2Gi", "2Gi"),
        (None, "4Gi", "4Gi"),
    ],
)
def test_shm_is_the_spec_else_half_of_memory_else_1gi(
    memory: str | None, shm: str | None, size: str
) -> None:
    builder = TrainingRunBuilder("r")
    if memory:
        builder.with_("spec.resources.memory", memory)
    if shm:
        builder.with_("spec.resources.shmSize", shm)
    p = pods.pod(api.parse_trainingrun(builder.obj()), 0, image="img")
    dshm = next(v for v in p["spec"]["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": size}


def test_optional_outputs_tell_the_launcher_a_failed_archive_is_not_fatal() -> None:
    settings = pods.Settings(registry_url="http://registry:8080")
    strict = pods.pod(
        api.parse_trainingrun(TrainingRunBuilder("r").obj()), 0, image="i", settings=settings
    )
    assert "TORCHYARD_OUTPUTS_OPTIONAL" not in env_of(strict)
    body = TrainingRunBuilder("r").with_("spec.outputs.optional", True).obj()
    lenient = pods.pod(api.parse_trainingrun(body), 0, image="i", settings=settings)
    assert env_of(lenient)["TORCHYARD_OUTPUTS_OPTIONAL"] == "1"

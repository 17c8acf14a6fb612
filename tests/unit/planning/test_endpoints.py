"""The children of an OnlineEndpoint (torchyard.planning.endpoints): the serving Pod
(Pod Security "restricted", no API token, the model read-only from its inputs cache entry
at AZUREML_MODEL_DIR, the runtime from the init container), the rollout settings, the
canary's split, the Service, the autoscaler and KServe's InferenceService."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import EndpointBuilder
from torchyard import api
from torchyard.planning import endpoints as plans
from torchyard.planning.pods import Settings
from torchyard.serving import contract

SETTINGS = Settings(
    init_image="torchyard.local/torchyard:abc",
    registry_url="https://registry.torchyard-system.svc:8443",
    registry_ca="PEM",
)


def endpoint(builder: EndpointBuilder | None = None) -> api.OnlineEndpoint:
    body = (builder or EndpointBuilder("birds", "team-a").model("pytorch-birds", 2)).obj()
    body["metadata"]["uid"] = "uid-1"
    return api.parse_endpoint(body)


def parts(ep: api.OnlineEndpoint, version: int = 2, **kw: Any) -> plans.PodInputs:
    key = plans.model_source(ep, "pytorch-birds", version).key
    return plans.PodInputs(
        "pytorch-birds", "registry/env@sha256:1", key, kw.pop("settings", SETTINGS), **kw
    )


def deployment(ep: api.OnlineEndpoint, **kw: Any) -> dict[str, Any]:
    track = plans.tracks(ep, 2)[0]
    return plans.deployment(ep, track, parts(ep, track.version, **kw))


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_serving_pod_is_restricted_and_holds_no_token() -> None:
    pod = deployment(endpoint())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in [*pod["initContainers"], *pod["containers"]]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["runAsNonRoot"] is True
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "registry-token" not in volumes  # a ConfigMap source needs none
    assert all("hostPath" not in v for v in volumes.values())


def test_the_model_is_its_cache_entry_read_only_at_azureml_model_dir() -> None:
    ep = endpoint()
    key = plans.model_source(ep, "pytorch-birds", 2).key
    pod = deployment(ep)["spec"]["template"]["spec"]
    scorer = pod["containers"][0]
    mount = next(m for m in scorer["volumeMounts"] if m["name"] == "inputs-cache")
    assert mount == {
        "name": "inputs-cache",
        "mountPath": "/var/azureml-app/azureml-models/pytorch-birds/2",
        "subPath": f"entries/{key}/data",
        "readOnly": True,
    }
    claim = next(v for v in pod["volumes"] if v["name"] == "inputs-cache")
    assert claim["persistentVolumeClaim"] == {"claimName": "torchyard-inputs", "readOnly": True}
    env = env_of(scorer)
    assert env["AZUREML_MODEL_DIR"] == mount["mountPath"]
    assert env["AZUREML_ENTRY_SCRIPT"] == "/workspace/pytorch_score.py"
    assert env["PYTHONPATH"] == contract.RUNTIME_LIB
    assert (env[contract.MODEL_NAME], env[contract.MODEL_VERSION]) == ("pytorch-birds", "2")
    # read by the endpoint's ServiceAccount: another reader is another entry
    other = api.parse_endpoint(
        EndpointBuilder("birds", "team-a")
        .model("pytorch-birds", 2)
        .set("spec.serviceAccountName", "x")
        .obj()
    )
    assert plans.model_source(other, "pytorch-birds", 2).key != key


def test_the_runtime_comes_from_the_init_container_and_runs_in_the_environments_image() -> None:
    pod = deployment(endpoint())["spec"]["template"]["spec"]
    prepare = pod["initContainers"][-1]
    assert prepare["image"] == SETTINGS.init_image
    assert prepare["command"] == [
        "python3", "-m", "torchyard.serving.prepare", "--runtime", contract.RUNTIME_ROOT,
        "--", "--copy", "/torchyard/source", "/workspace",
    ]  # fmt: skip
    assert prepare["securityContext"]["readOnlyRootFilesystem"] is True
    scorer = pod["containers"][0]
    assert scorer["image"] == "registry/env@sha256:1"
    assert scorer["command"] == ["python3", "-m", "torchyard.serving"]
    runtime = next(m for m in scorer["volumeMounts"] if m["name"] == "runtime")
    assert runtime["readOnly"] is True
    assert scorer["readinessProbe"]["httpGet"]["path"] == contract.READY_PATH
    assert scorer["livenessProbe"]["httpGet"]["path"] == contract.LIVE_PATH
    assert scorer["ports"] == [{"name": "http", "containerPort": 8080}]


def test_a_snapshot_source_gives_the_registry_token_to_the_init_container_only() -> None:
    ep = endpoint(
        EndpointBuilder("birds", "team-a")
        .model("pytorch-birds", 2)
        .set("spec.source", {"snapshot": "a" * 64})
    )
    pod = deployment(ep)["spec"]["template"]["spec"]
    prepare, scorer = pod["initContainers"][-1], pod["containers"][0]
    assert prepare["command"][-4:] == ["--", "--fetch", "a" * 64, "/workspace"]
    assert any(m["name"] == "registry-token" for m in prepare["volumeMounts"])
    assert not any(m["name"] == "registry-token" for m in scorer["volumeMounts"])
    token = next(v for v in pod["volumes"] if v["name"] == "registry-token")
    assert (
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "torchyard-registry"
    )


def test_a_git_source_is_cloned_and_an_image_source_runs_where_the_image_says() -> None:
    git = endpoint(
        EndpointBuilder("birds", "team-a")
        .model("pytorch-birds", 2)
        .set("spec.source", {"git": {"url": "https://git.example/x.git"}})
    )
    pod = deployment(git)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["git-clone", "prepare"]
    image = endpoint(
        EndpointBuilder("birds", "team-a")
        .model("pytorch-birds", 2)
        .set("spec.source", {"image": True})
    )
    scorer = deployment(image)["spec"]["template"]["spec"]["containers"][0]
    assert (
        "workingDir" not in scorer and env_of(scorer)["AZUREML_ENTRY_SCRIPT"] == "pytorch_score.py"
    )


def test_a_rollout_never_takes_a_pod_away_before_its_successor_is_ready() -> None:
    spec = deployment(endpoint())["spec"]
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert spec["minReadySeconds"] >= 1 and spec["replicas"] == 1
    pod = spec["template"]["spec"]
    # the drain and the longest request fit the grace period
    assert pod["terminationGracePeriodSeconds"] > contract.DEFAULT_DRAIN_SECONDS + 60


def test_a_changed_configmap_rolls_the_pods() -> None:
    ep = endpoint()
    one = deployment(ep, source_sha256="aa")["spec"]["template"]
    two = deployment(ep, source_sha256="bb")["spec"]["template"]
    assert one != two and one["metadata"]["annotations"] == {"torchyard.dev/source-sha256": "aa"}


def test_a_private_endpoint_asks_the_registry_and_needs_one() -> None:
    env = env_of(deployment(endpoint())["spec"]["template"]["spec"]["containers"][0])
    assert env[contract.ACCESS_URL] == (
        "https://registry.torchyard-system.svc:8443/v1/namespaces/team-a/endpoints/birds/access"
    )
    assert env[contract.REGISTRY_CA] == "PEM"
    with pytest.raises(ValueError, match=r"set spec\.public: true"):
        deployment(endpoint(), settings=Settings())
    public = endpoint(EndpointBuilder("birds", "team-a").model("pytorch-birds", 2).public())
    env = env_of(
        deployment(public, settings=Settings())["spec"]["template"]["spec"]["containers"][0]
    )
    assert contract.ACCESS_URL not in env


@pytest.mark.parametrize(
    "replicas, traffic, expected",
    [
        (10, {"v1": 90, "v2": 10}, [("primary", 2, 10, 1), ("canary", 1, 90, 9)]),
        (1, {"v1": 90, "v2": 10}, [("primary", 2, 10, 1), ("canary", 1, 90, 1)]),
        (4, {"v2": 100, "v1": 0}, [("primary", 2, 100, 4)]),
        (4, {"v2": 0, "v1": 100}, [("canary", 1, 100, 4)]),
        (4, {"v2": 50, "v1": 50}, [("primary", 2, 50, 2), ("canary", 1, 50, 2)]),
    ],
)
def test_a_canary_splits_the_pods_by_the_shares(
    replicas: int, traffic: dict[str, int], expected: list[tuple[str, int, int, int]]
) -> None:
    ep = endpoint(
        EndpointBuilder("birds", "a")
        .model("pytorch-birds", 2)
        .replicas(replicas)
        .traffic(**traffic)
    )
    plan = plans.tracks(ep, 2)
    assert [(t.name, t.version, t.percent, t.replicas) for t in plan] == expected


def test_the_share_is_what_the_pods_make_it() -> None:
    ep = endpoint(
        EndpointBuilder("birds", "a").model("pytorch-birds", 2).replicas(1).traffic(v1=90, v2=10)
    )
    assert plans.shares(plans.tracks(ep, 2)) == {2: 50, 1: 50}
    ep = endpoint(
        EndpointBuilder("birds", "a").model("pytorch-birds", 2).replicas(10).traffic(v1=90, v2=10)
    )
    assert plans.shares(plans.tracks(ep, 2)) == {2: 10, 1: 90}


def test_both_versions_are_behind_one_service_and_each_deployment_selects_its_own() -> None:
    ep = endpoint(
        EndpointBuilder("birds", "a").model("pytorch-birds", 2).replicas(4).traffic(v1=50, v2=50)
    )
    service = plans.service(ep)
    assert service["spec"]["selector"] == {"torchyard.dev/endpoint": "birds"}
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    names = []
    for track in plans.tracks(ep, 2):
        d = plans.deployment(ep, track, parts(ep, track.version))
        names.append(d["metadata"]["name"])
        assert d["spec"]["selector"]["matchLabels"] == {
            "torchyard.dev/endpoint": "birds",
            "torchyard.dev/track": track.name,
        }
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert labels["torchyard.dev/model-version"] == str(track.version)
        assert d["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert names == ["birds", "birds-canary"]
    assert plans.scoring_uri(ep) == "http://birds.a.svc/score"


def test_autoscaling_leaves_the_replicas_to_the_autoscaler() -> None:
    ep = endpoint(
        EndpointBuilder("birds", "a").model("pytorch-birds", 2).set("spec.resources", {"cpu": "1"})
        .set("spec.autoscaling", {"minReplicas": 2, "maxReplicas": 5})
    )  # fmt: skip
    assert "replicas" not in deployment(ep)["spec"]
    hpa = plans.autoscaler(ep)
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["name"] == "birds"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert plans.autoscaler(endpoint()) is None


def test_kserve_gets_the_same_pod_as_its_custom_predictor() -> None:
    ep = endpoint(
        EndpointBuilder("birds", "a")
        .model("pytorch-birds", 2)
        .replicas(2)
        .set("spec.backend", "KServe")
    )
    track = plans.tracks(ep, 2)[0]
    isvc = plans.inference_service(ep, track, parts(ep))
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Standard"}
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 2)
    assert predictor["containers"][0]["name"] == "kserve-container"
    assert predictor["containers"][0]["command"] == ["python3", "-m", "torchyard.serving"]
    assert predictor["automountServiceAccountToken"] is False
    assert predictor["labels"]["torchyard.dev/endpoint"] == "birds"
    same = plans.pod_spec(ep, track, parts(ep), "kserve-container")
    assert {k: v for k, v in predictor.items() if k in same} == same
    assert plans.scoring_uri(ep) == "http://birds-predictor.a.svc/score"


def test_the_cache_keys_an_endpoint_holds() -> None:
    body = (
        EndpointBuilder("birds", "a")
        .model("pytorch-birds", 2)
        .replicas(2)
        .traffic(v1=50, v2=50)
        .obj()
    )
    ep = api.parse_endpoint(body)
    assert plans.cache_keys(body) == sorted(
        plans.model_source(ep, "pytorch-birds", v).key for v in (1, 2)
    )
    swept = EndpointBuilder("birds", "a").sweep("tune").obj()
    assert plans.cache_keys(swept) == []
    swept["status"] = {"model": {"name": "pytorch-birds", "version": 3}}
    assert len(plans.cache_keys(swept)) == 1
    assert plans.cache_keys({"spec": {"model": "nonsense"}}) == []

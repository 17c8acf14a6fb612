"""The manifests of a run's inputs: each process finds each input at its path through
TORCHYARD_INPUT_<NAME>; cache entries and claims are mounted read-only (a download input
gets a writable copy); the fetch Job runs CPU only, non-root, without an API token, and
refuses to retry a fetch that failed for its own reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api
from torchyard.launch import contract
from torchyard.planning import inputs, names, pods

SHA = "ab" * 32


def run(*specs: dict[str, Any], sa: str = "default") -> api.TrainingRun:
    body = (
        TrainingRunBuilder("birds", "team")
        .with_("spec.inputs", list(specs))
        .with_("spec.serviceAccountName", sa)
        .obj()
    )
    return api.parse_trainingrun(body)


BIRDS = {"name": "birds", "uri": "https://example.org/birds.tgz", "sha256": SHA}
BASE = {"name": "base", "uri": "model://birds", "revision": "3", "mode": "download"}
DATA = {"name": "data", "uri": "pvc://datasets/birds/2024", "path": "/data"}


def trainer(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_every_process_gets_each_inputs_folder() -> None:
    r = run(BIRDS, BASE, DATA)
    env = {e["name"]: e["value"] for e in trainer(pods.pod(r, 0, image="img"))["env"]}
    assert env["TORCHYARD_INPUT_BIRDS"] == "/torchyard/inputs/birds"
    assert env["TORCHYARD_INPUT_BASE"] == "/torchyard/inputs/base"
    assert env["TORCHYARD_INPUT_DATA"] == "/data"
    assert json.loads(env["TORCHYARD_INPUTS_COPIES"]) == [
        ["/torchyard/input-sources/base", "/torchyard/inputs/base"]
    ]


def test_arguments_may_name_an_input() -> None:
    env = {"TORCHYARD_INPUT_BIRDS": "/torchyard/inputs/birds", "RANK": "3"}
    args = ["--data", "$TORCHYARD_INPUT_BIRDS", "${TORCHYARD_INPUT_BIRDS}/x", "$RANK", "$HOME"]
    assert contract.expand_arguments(args, env) == [
        "--data",
        "/torchyard/inputs/birds",
        "/torchyard/inputs/birds/x",
        "3",
        "$HOME",
    ]
    assert contract.expand_arguments(["$TORCHYARD_INPUT_OTHER"], env) == ["$TORCHYARD_INPUT_OTHER"]


def test_cache_entries_and_claims_are_mounted_read_only() -> None:
    r = run(BIRDS, BASE, DATA)
    manifest = pods.pod(r, 0, image="img")
    keys = inputs.keys(r)
    mounts = {m["mountPath"]: m for m in trainer(manifest)["volumeMounts"]}
    assert mounts["/torchyard/inputs/birds"] == {
        "name": "inputs-cache",
        "mountPath": "/torchyard/inputs/birds",
        "subPath": f"entries/{keys['birds']}/data",
        "readOnly": True,
    }
    assert mounts["/torchyard/input-sources/base"]["readOnly"] is True
    assert mounts["/torchyard/input-sources/base"]["subPath"] == f"entries/{keys['base']}/data"
    assert "readOnly" not in mounts["/torchyard/inputs/base"], "the download's copy is writable"
    assert mounts["/data"]["subPath"] == "birds/2024" and mounts["/data"]["readOnly"] is True
    volumes = {v["name"]: v for v in manifest["spec"]["volumes"]}
    assert volumes["inputs-cache"]["persistentVolumeClaim"] == {
        "claimName": names.INPUTS_CLAIM,
        "readOnly": True,
    }
    assert volumes["input-2"]["persistentVolumeClaim"] == {
        "claimName": "datasets",
        "readOnly": True,
    }
    assert volumes["input-1-copy"] == {"name": "input-1-copy", "emptyDir": {}}


def test_a_run_without_inputs_has_none_of_it() -> None:
    manifest = pods.pod(run(), 0, image="img")
    assert not [v for v in manifest["spec"]["volumes"] if v["name"].startswith("input")]
    assert not [e for e in trainer(manifest)["env"] if e["name"].startswith("TORCHYARD_INPUT")]


def test_a_model_key_depends_on_who_reads_it() -> None:
    assert inputs.keys(run(BASE, sa="a"))["base"] != inputs.keys(run(BASE, sa="b"))["base"]
    assert inputs.keys(run(BIRDS, sa="a")) == inputs.keys(run(BIRDS, sa="b"))
    assert (
        inputs.keys(run(BASE))["base"]
        == inputs.keys(run({**BASE, "uri": "model://birds/3", "revision": None}))["base"]
    ), "model://birds with revision 3 is model://birds/3"


def job(source_spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    r = run(source_spec, sa="trainer")
    [(_, source)] = inputs.fetched(r)
    return inputs.fetch_job(
        "team", source, image="ghcr.io/torchyard/torchyard:1", cache=inputs.CacheSettings(), **kw
    )


def test_the_fetch_job_holds_no_gpu_no_api_token_and_runs_restricted() -> None:
    manifest = job(BIRDS, evict=["k1"])
    pod = manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "default"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    resources = json.dumps(container["resources"])
    assert "gpu" not in resources and container["resources"]["requests"]["cpu"] == "100m"
    assert container["command"] == ["python3", "-m", "torchyard.inputs.fetch"]
    assert container["args"][-2:] == ["--evict", "k1"]
    assert container["args"][8:10] == ["--sha256", SHA]
    assert not [v for v in pod["volumes"] if "projected" in v or "secret" in v]
    rule = manifest["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [1]


def test_a_model_fetch_reads_with_the_runs_registry_token_only() -> None:
    manifest = job(BASE, evict=[], registry_url="https://registry.torchyard:8443")
    pod = manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["automountServiceAccountToken"] is False
    [token] = [v for v in pod["volumes"] if "projected" in v]
    source = token["projected"]["sources"][0]["serviceAccountToken"]
    assert source["audience"] == "torchyard-registry"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["TORCHYARD_REGISTRY_URL"] == "https://registry.torchyard:8443"
    assert env["TORCHYARD_NAMESPACE"] == "team"
    assert "--reader" in pod["containers"][0]["args"]


def test_one_job_per_key() -> None:
    a, b = job(BIRDS, evict=[]), job({**BIRDS, "name": "other"}, evict=[])
    assert a["metadata"]["name"] == b["metadata"]["name"]
    c = job({**BIRDS, "include": ["*.jpg"]}, evict=[])
    assert c["metadata"]["name"] != a["metadata"]["name"]


S3 = {"name": "shots", "uri": "s3://birds/train", "secretRef": "birds-store", "include": ["*.jpg"]}


def secret_env(container: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    return {
        e["name"]: (ref["name"], ref["key"], ref["optional"])
        for e in container["env"]
        if (ref := e.get("valueFrom", {}).get("secretKeyRef"))
    }


def test_an_s3_fetch_gets_its_secret_and_the_runs_pods_do_not() -> None:
    manifest = job(S3, evict=[])
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    # The credentials are required: without them the kubelet holds the Pod back, and the
    # operator says which key of which Secret is missing.
    assert secret_env(container) == {
        "AWS_ACCESS_KEY_ID": ("birds-store", "AWS_ACCESS_KEY_ID", False),
        "AWS_SECRET_ACCESS_KEY": ("birds-store", "AWS_SECRET_ACCESS_KEY", False),
        "AWS_ENDPOINT_URL": ("birds-store", "AWS_ENDPOINT_URL", True),
        "AWS_ENDPOINT_URL_S3": ("birds-store", "AWS_ENDPOINT_URL_S3", True),
        "AWS_REGION": ("birds-store", "AWS_REGION", True),
        "AWS_DEFAULT_REGION": ("birds-store", "AWS_DEFAULT_REGION", True),
    }
    assert container["args"][container["args"].index("--secret") + 1] == "birds-store"
    pod = json.dumps(pods.pod(run(S3), 0, image="img"))
    assert "birds-store" not in pod and "secretKeyRef" not in pod
    https = job(BIRDS, evict=[])["spec"]["template"]["spec"]["containers"][0]
    assert secret_env(https) == {} and "envFrom" not in https


def test_an_s3_key_depends_on_its_secret() -> None:
    other = {**S3, "secretRef": "other-store"}
    assert inputs.keys(run(S3))["shots"] != inputs.keys(run(other))["shots"]


def test_a_secret_is_for_s3_and_hf_inputs_only() -> None:
    with pytest.raises(ValueError, match="secretRef is for s3:// and hf:// inputs only"):
        run({**BIRDS, "secretRef": "birds-store"})


HF = {"name": "base", "uri": "hf://acme/tiny@v1", "secretRef": "hub", "include": ["*.json"]}


def test_an_hf_fetch_gets_its_secret_and_a_writable_client_home_and_the_runs_pods_do_not() -> None:
    container = job(HF, evict=[])["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "hub"}}]
    assert container["args"][container["args"].index("--uri") + 1] == "hf://acme/tiny@v1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HOME"].startswith("/tmp/")
    assert "HF_TOKEN" not in env and "HF_ENDPOINT" not in env  # the Secret's, not the spec's
    pod = json.dumps(pods.pod(run(HF), 0, image="img"))
    assert '"hub"' not in pod and "secretRef" not in pod and "HF_HOME" not in pod
    assert inputs.keys(run(HF))["base"] != inputs.keys(run({**HF, "secretRef": "other"}))["base"]


def test_a_model_input_without_a_version_is_pinned_to_the_one_given_or_recorded() -> None:
    body = run({"name": "base", "uri": "model://birds"}, {**BIRDS, "name": "other"})
    assert [i.name for i in inputs.unversioned(body)] == ["base"]
    assert inputs.pinned(body, {}) is body
    pinned = inputs.pinned(body, {"base": "4", "other": "9"})
    assert [i.canonical_uri for i in pinned.spec.inputs] == ["model://birds/4", BIRDS["uri"]]
    assert inputs.unversioned(pinned) == []
    assert (
        inputs.keys(pinned)["base"]
        == inputs.keys(run({"name": "base", "uri": "model://birds/4"}))["base"]
    )
    status = {
        "inputs": [{"name": "base", "uri": "model://birds/4"}, {"name": "x", "uri": "s3://b/x"}]
    }
    assert inputs.recorded_versions(status) == {"base": "4"}

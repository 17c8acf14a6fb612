"""Inputs on the real control plane (KWOK runs the Pods): a run with inputs is Preparing
while one fetch Job fills the namespace's cache, holds no Pod (so no GPU) meanwhile, and
is admitted only after the Job succeeded; a second run fetches nothing; concurrent runs
share one Job; a failed fetch fails the runs that waited with the input, its URI and the
fetcher's error; an s3:// or hf:// input's Secret reaches its fetch Job only, and an hf://
input's status records the commit its revision resolved to; a model:// input with no
version is pinned to the model's latest version (none: the run fails naming it); a pvc://
input waits for its claim."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment, model_version
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_instead
from tests.integration.helpers import (
    conditions,
    finish_pod,
    host_volume,
    run_pods,
    wait_for,
    wait_status,
)
from torchyard import api, k8s
from torchyard.planning import inputs, names

SHA = "ab" * 32
BIRDS = {"name": "birds", "uri": "https://files.example/birds.tgz", "sha256": SHA}


@pytest.fixture
def inputs_operator(
    cluster: Cluster,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    operator: InProcessOperator,
) -> Iterator[tuple[str, InProcessOperator]]:
    """``namespace`` with a volume for its inputs cache (a storage class of its own), an
    operator that claims it instead of the session's (which read its settings before this
    class existed), and a Ready Environment ``pytorch``; the namespace and that operator."""
    name = f"inputs-{namespace}"[:63]
    host_volume(cluster, name, f"/tmp/{name}", "50Gi")
    monkeypatch.setenv("TORCHYARD_INPUTS_STORAGE_CLASS", name)
    with operator_instead(operator) as instead:
        k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15-cuda12"))
        wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
        yield namespace, instead
    cluster.kubectl("delete", "pv", name, "--wait=false", check=False)


@pytest.fixture
def prepared(inputs_operator: tuple[str, InProcessOperator]) -> str:
    """The namespace of :func:`inputs_operator`."""
    return inputs_operator[0]


def run(name: str, namespace: str, *specs: dict[str, Any]) -> dict[str, Any]:
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .gpus(1)
        .pool("a100")
        .with_("spec.inputs", list(specs))
        .obj()
    )


def fetch_jobs(namespace: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/component={inputs.COMPONENT_FETCH}"
    return k8s.list_(k8s.JOBS, namespace, label_selector=selector)


def fetch_pod(namespace: str, job: str) -> str:
    pods = wait_for(
        "the fetch Pod running",
        lambda: [
            p
            for p in k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={job}")
            if p.get("status", {}).get("phase") == "Running"
        ],
        timeout=60,
    )
    return str(pods[0]["metadata"]["name"])


def submitted_fetch(
    ns: str, name: str, spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Submit run ``name`` with the input ``spec``: its fetch Job, and the Job's container."""
    k8s.create(run(name, ns, spec))
    [job] = wait_for("the fetch Job", lambda: fetch_jobs(ns))
    return job, job["spec"]["template"]["spec"]["containers"][0]


def fail_fetch(
    cluster: Cluster, ns: str, name: str, job: dict[str, Any], error: str
) -> dict[str, Any]:
    """End ``job``'s Pod as a fetcher that failed with ``error``; the run ``name``, Failed."""
    finish_pod(cluster, ns, fetch_pod(ns, job["metadata"]["name"]), 1, json.dumps({"error": error}))
    return wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Failed", timeout=60)


def next_fetch_job(ns: str, job: dict[str, Any]) -> dict[str, Any]:
    """The fetch Job started after ``job``."""
    [new] = wait_for(
        "a new fetch Job",
        lambda: [j for j in fetch_jobs(ns) if j["metadata"]["uid"] != job["metadata"]["uid"]],
        timeout=60,
    )
    return dict(new)


def key_of(body: dict[str, Any], name: str = "birds") -> str:
    return inputs.keys(api.parse_trainingrun(body))[name]


def done(key: str, fetched: int, size: int = 1234) -> str:
    entry = {
        "key": key,
        "uri": BIRDS["uri"],
        "revision": SHA,
        "digest": "sha256:" + "cd" * 32,
        "bytes": size,
    }
    return json.dumps({"entry": entry, "fetchedBytes": fetched})


def test_a_run_is_preparing_without_pods_until_its_fetch_job_succeeded(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    body = run("birds", ns, BIRDS)
    k8s.create(body)
    preparing = wait_status(
        k8s.TRAININGRUNS, ns, "birds", lambda s: s.get("phase") == "Preparing", timeout=60
    )
    ready = conditions(preparing)["InputsReady"]
    assert (ready["status"], ready["reason"]) == ("False", "Fetching")
    assert BIRDS["uri"] in ready["message"]
    [job] = wait_for("the fetch Job", lambda: fetch_jobs(ns))
    key = key_of(body)
    assert job["metadata"]["name"] == names.input_fetch(key)
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "gpu" not in json.dumps(pod["containers"][0]["resources"])
    claim = k8s.get(k8s.PERSISTENTVOLUMECLAIMS, ns, names.INPUTS_CLAIM)
    assert claim["spec"]["storageClassName"].startswith("inputs-")

    fetcher = fetch_pod(ns, job["metadata"]["name"])
    # While the fetch runs, the run holds no Pod, so no GPU: the only Pod is the fetcher's.
    assert run_pods(ns, "birds") == []
    assert [p["metadata"]["name"] for p in k8s.list_(k8s.PODS, ns)] == [fetcher]
    finish_pod(cluster, ns, fetcher, 0, done(key, 1234))
    admitted = wait_status(
        k8s.TRAININGRUNS, ns, "birds", lambda s: s.get("phase") == "Running", timeout=60
    )
    assert conditions(admitted)["InputsReady"]["status"] == "True"
    assert admitted["status"]["inputs"] == [
        {
            "name": "birds",
            "uri": BIRDS["uri"],
            "revision": SHA,
            "digest": "sha256:" + "cd" * 32,
            "bytes": 1234,
            "fetchedBytes": 1234,
            "key": key,
        }
    ]
    [node] = run_pods(ns, "birds")
    mounts = {m["mountPath"]: m for m in node["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/torchyard/inputs/birds"]["subPath"] == f"entries/{key}/data"
    assert mounts["/torchyard/inputs/birds"]["readOnly"] is True
    index = k8s.get(k8s.CONFIGMAPS, ns, names.input_entry(key))
    assert json.loads(index["data"]["entry"])["key"] == key

    # A second run of the same input: ready at once, nothing fetched, no new Job.
    k8s.create(run("again", ns, {**BIRDS, "name": "birds", "mode": "download"}))
    again = wait_status(
        k8s.TRAININGRUNS, ns, "again", lambda s: s.get("phase") == "Running", timeout=60
    )
    assert again["status"]["inputs"][0]["fetchedBytes"] == 0
    assert again["status"]["inputs"][0]["digest"] == "sha256:" + "cd" * 32
    assert len(fetch_jobs(ns)) == 1


def test_concurrent_runs_share_one_fetch_and_its_failure_names_the_input(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    for name in ("first", "second"):
        k8s.create(run(name, ns, BIRDS))
    for name in ("first", "second"):
        wait_status(k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Preparing")
    [job] = fetch_jobs(ns)
    error = "https://files.example/birds.tgz: HTTP 404 Not Found: nothing is there: check the URL"
    finish_pod(cluster, ns, fetch_pod(ns, job["metadata"]["name"]), 1, json.dumps({"error": error}))
    for name in ("first", "second"):
        failed = wait_status(
            k8s.TRAININGRUNS, ns, name, lambda s: s.get("phase") == "Failed", timeout=60
        )
        assert failed["status"]["failure"]["reason"] == "InputFetchFailed"
        assert failed["status"]["failure"]["message"] == (f"input birds ({BIRDS['uri']}): {error}")
        assert conditions(failed)["InputsReady"]["reason"] == "InputFetchFailed"
        assert run_pods(ns, name) == []
    assert len(fetch_jobs(ns)) == 1
    assert not k8s.list_(
        k8s.CONFIGMAPS, ns, label_selector=f"app.kubernetes.io/component={inputs.COMPONENT_ENTRY}"
    ), "a failed fetch is not in the index"

    # A run submitted after the failure tries again, with a Job of its own.
    k8s.create(run("third", ns, BIRDS))
    wait_for(
        "a new fetch Job",
        lambda: [j for j in fetch_jobs(ns) if j["metadata"]["uid"] != job["metadata"]["uid"]],
        timeout=60,
    )
    third = k8s.get(k8s.TRAININGRUNS, ns, "third")
    assert third["status"]["phase"] == "Preparing"


def test_a_claim_input_waits_for_its_claim(prepared: str) -> None:
    ns = prepared
    k8s.create(run("claimed", ns, {"name": "data", "uri": "pvc://datasets/birds"}))
    waiting = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "claimed",
        lambda s: (
            (conditions({"status": s}).get("Admitted") or {}).get("reason")
            == "PersistentVolumeClaimNotFound"
        ),
    )
    assert (
        "spec.inputs: PersistentVolumeClaim datasets does not exist"
        in (conditions(waiting)["Admitted"]["message"])
    )
    assert fetch_jobs(ns) == [], "a claim is mounted, not fetched"


SHOTS = {"name": "shots", "uri": "s3://birds/train", "secretRef": "birds-store"}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "YWtpZA==", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0"}


def secret(namespace: str, data: dict[str, str], name: str = "birds-store") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}


def test_an_s3_fetch_reads_its_secret_and_the_run_never_sees_it(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    k8s.create(secret(ns, CREDENTIALS))
    job, container = submitted_fetch(ns, "shots", SHOTS)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert {ref["name"] for ref in refs.values()} == {"birds-store"}
    assert {k for k, ref in refs.items() if not ref["optional"]} == set(CREDENTIALS)
    error = (
        "s3://birds/train: S3 answered HTTP 403 (InvalidAccessKeyId: The AWS Access Key Id "
        "you provided does not exist in our records.): the access key is not one the store "
        "knows: check AWS_ACCESS_KEY_ID in the input's Secret"
    )
    failed = fail_fetch(cluster, ns, "shots", job, error)
    assert failed["status"]["failure"]["message"] == f"input shots ({SHOTS['uri']}): {error}"
    assert run_pods(ns, "shots") == []

    # Fetched: the run's Pods mount the entry and get nothing of the Secret.
    body = run("again", ns, SHOTS)
    k8s.create(body)
    job = next_fetch_job(ns, job)
    key = key_of(body, "shots")
    finish_pod(cluster, ns, fetch_pod(ns, job["metadata"]["name"]), 0, done(key, 1234))
    wait_status(k8s.TRAININGRUNS, ns, "again", lambda s: s.get("phase") == "Running", timeout=60)
    [node] = run_pods(ns, "again")
    assert "birds-store" not in json.dumps(node["spec"])


BASE = {"name": "base", "uri": "hf://acme/tiny@main", "secretRef": "hub", "include": ["*.json"]}
COMMIT = "5f" * 20


def test_an_hf_fetch_reads_its_secret_and_the_run_records_the_commit(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    job, container = submitted_fetch(ns, "tuned", BASE)
    assert container["envFrom"] == [{"secretRef": {"name": "hub"}}]
    assert container["args"][container["args"].index("--uri") + 1] == BASE["uri"]
    error = "hf://acme/tiny@main: acme/tiny has no revision 'main': check the branch, tag or commit"
    failed = fail_fetch(cluster, ns, "tuned", job, error)
    assert failed["status"]["failure"]["message"] == f"input base ({BASE['uri']}): {error}"
    assert conditions(failed)["InputsReady"]["reason"] == "InputFetchFailed"

    body = run("again", ns, BASE)
    k8s.create(body)
    job = next_fetch_job(ns, job)
    key = key_of(body, "base")
    entry = {"key": key, "uri": BASE["uri"], "revision": COMMIT, "digest": "sha256:" + "e" * 64}
    said = json.dumps({"entry": {**entry, "bytes": 42}, "fetchedBytes": 42})
    finish_pod(cluster, ns, fetch_pod(ns, job["metadata"]["name"]), 0, said)
    admitted = wait_status(
        k8s.TRAININGRUNS, ns, "again", lambda s: s.get("phase") == "Running", timeout=60
    )
    [status] = admitted["status"]["inputs"]
    assert (status["uri"], status["revision"], status["fetchedBytes"]) == (BASE["uri"], COMMIT, 42)
    [node] = run_pods(ns, "again")
    assert '"hub"' not in json.dumps(node["spec"]) and "HF_" not in json.dumps(node["spec"])
    mounts = {m["mountPath"]: m for m in node["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/torchyard/inputs/base"]["subPath"] == f"entries/{key}/data"


def test_a_model_input_without_a_version_starts_from_the_latest_and_keeps_it(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    latest = {"name": "base", "uri": "model://birds"}
    k8s.create(run("early", ns, latest))
    failed = wait_status(
        k8s.TRAININGRUNS, ns, "early", lambda s: s.get("phase") == "Failed", timeout=60
    )
    assert failed["status"]["failure"]["message"] == (
        f"input base (model://birds): model birds has no version in namespace {ns} to start "
        "from: register one first (torchyard models list)"
    )
    assert fetch_jobs(ns) == []

    for version in (1, 3, 2):
        k8s.create(model_version(f"birds-v{version}", ns, "birds", version))
    k8s.create(model_version("other-v9", ns, "other", 9))
    k8s.create(run("tuned", ns, latest))
    [job] = wait_for("the fetch Job", lambda: fetch_jobs(ns))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--uri") + 1] == "model://birds/3"
    wait_status(
        k8s.TRAININGRUNS,
        ns,
        "tuned",
        lambda s: [i.get("uri") for i in s.get("inputs") or []] == ["model://birds/3"],
    )

    k8s.create(model_version("birds-v4", ns, "birds", 4))  # the run keeps the one it took
    pinned = api.parse_trainingrun(run("tuned", ns, {**latest, "revision": "3"}))
    key = inputs.keys(pinned)["base"]
    entry = {"key": key, "uri": "model://birds/3", "revision": "3", "digest": "sha256:" + "f" * 64}
    said = json.dumps({"entry": {**entry, "bytes": 3}, "fetchedBytes": 3})
    finish_pod(cluster, ns, fetch_pod(ns, job["metadata"]["name"]), 0, said)
    admitted = wait_status(
        k8s.TRAININGRUNS, ns, "tuned", lambda s: s.get("phase") == "Running", timeout=60
    )
    assert [(i["uri"], i["revision"]) for i in admitted["status"]["inputs"]] == [
        ("model://birds/3", "3")
    ]
    [node] = run_pods(ns, "tuned")
    mounts = {m["mountPath"]: m for m in node["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/torchyard/inputs/base"]["subPath"] == f"entries/{key}/data"

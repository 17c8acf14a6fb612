"""OnlineEndpoints on the real control plane (KWOK runs the serving Pods): the apiserver
refuses hostile specs by the CRD's CEL rules; an endpoint is Preparing while one fetch Job
puts its model into the namespace's inputs cache, holds no Pod meanwhile, then serves from
a Deployment behind a Service and rolls to a new version; a canary's Deployment comes and
goes with spec.traffic; a private endpoint's Pods ask the registry, and the registry
answers them with the cluster's TokenReview and SubjectAccessReview: the serving runtime
itself, run here against it, lets in a token that may get the endpoint and refuses one of
another namespace. The real Pods (init() in a real image, a rollout under load) are on the
real node: tests/node/test_endpoints_on_node.py."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import EndpointBuilder, TrainingRunBuilder, environment, role_binding
from tests.cluster.harness import Cluster
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_instead
from tests.integration.helpers import finish_pod, host_volume, wait_for, wait_status
from tests.integration.test_inputs import fetch_pod
from tests.integration.test_registry_service import Service
from tests.unit.api.test_endpoint_spec import REFUSED
from torchyard import api, k8s
from torchyard.api import wire
from torchyard.planning import endpoints as plans
from torchyard.planning import inputs, names
from torchyard.serving import contract

REGISTRY_URL = "https://registry.torchyard-system.svc:8443"
OPERATOR = Path(__file__).resolve().parents[2] / "operator"
LIMIT = 64 * 1024  # the serving process's body limit in these tests


@pytest.fixture
def prepared(
    cluster: Cluster,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    operator: InProcessOperator,
) -> Iterator[str]:
    """``namespace`` with a volume for its inputs cache, an operator that knows a registry
    service (so endpoints that are not public may be served), a Ready Environment
    ``pytorch`` and the scoring code's ConfigMap ``birds-score``."""
    name = f"serving-{namespace}"[:63]
    host_volume(cluster, name, f"/tmp/{name}", "50Gi")
    monkeypatch.setenv("TORCHYARD_INPUTS_STORAGE_CLASS", name)
    monkeypatch.setenv("TORCHYARD_REGISTRY_URL", REGISTRY_URL)
    with operator_instead(operator):
        k8s.create(environment("pytorch", namespace, image="ghcr.io/acme/pytorch:2.15-cpu"))
        k8s.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "birds-score", "namespace": namespace},
                "data": {"pytorch_score.py": "def init(): pass\ndef run(raw_data): return {}\n"},
            }
        )
        wait_status(k8s.ENVIRONMENTS, namespace, "pytorch", lambda s: s.get("phase") == "Ready")
        yield namespace
    cluster.kubectl("delete", "pv", name, "--wait=false", check=False)


@pytest.mark.parametrize("what, path, value, said", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_apiserver_refuses_what_the_models_refuse(
    namespace: str, what: str, path: str, value: Any, said: str
) -> None:
    body = EndpointBuilder("birds", namespace).set(path, value).obj()
    with pytest.raises(k8s.ApiError) as err:
        k8s.create(body)
    assert err.value.invalid and said in err.value.message, err.value.message
    assert "no such key" not in err.value.message, err.value.message  # a rule that broke
    with pytest.raises(api.InvalidSpec):
        api.parse_endpoint(body)


def test_the_apiserver_takes_an_endpoint_with_only_the_required_fields(namespace: str) -> None:
    """Each CEL rule guards the optional fields it reads (has()): a rule that reads a
    missing field refuses every body with "no such key" instead of its own message."""
    body = EndpointBuilder("birds", namespace).obj()
    k8s.create(body)
    assert api.parse_endpoint(body).spec.env == []


def test_a_model_uri_climbing_out_of_the_registry_is_refused_naming_the_rule(
    namespace: str,
) -> None:
    for uri in ("model://../team-b/1", "model://birds/1/../../x", "model://birds/1?x=../"):
        body = EndpointBuilder("birds", namespace).set("spec.model", {"uri": uri}).obj()
        with pytest.raises(k8s.ApiError) as err:
            k8s.create(body)
        assert "model.uri must be model://<model>/<version>" in err.value.message, uri


def fetch_job(ns: str, uri: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        jobs = k8s.list_(
            k8s.JOBS, ns, label_selector=f"app.kubernetes.io/component={inputs.COMPONENT_FETCH}"
        )
        return [j for j in jobs if uri in j["spec"]["template"]["spec"]["containers"][0]["args"]]

    return dict(wait_for(f"the fetch Job of {uri}", found, timeout=60)[0])


def fetched(cluster: Cluster, ns: str, job: dict[str, Any], version: int) -> None:
    """End ``job``'s Pod as a fetcher that committed the model version's entry."""
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    key = args[args.index("--key") + 1]
    pod = fetch_pod(ns, job["metadata"]["name"])
    entry = {
        "key": key,
        "uri": f"model://pytorch-birds/{version}",
        "revision": str(version),
        "digest": "sha256:" + "cd" * 32,
        "bytes": 4321,
    }
    finish_pod(cluster, ns, pod, 0, json.dumps({"entry": entry, "fetchedBytes": 4321}))


def phase(ns: str, wanted: str, timeout: float = 90) -> dict[str, Any]:
    return wait_status(
        k8s.ONLINEENDPOINTS, ns, "birds", lambda s: s.get("phase") == wanted, timeout=timeout
    )


def serving_pods(ns: str) -> list[dict[str, Any]]:
    return k8s.list_(k8s.PODS, ns, label_selector=f"{names.LABEL_ENDPOINT}=birds")


def test_an_endpoint_fetches_its_model_serves_and_rolls_to_a_new_version(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    body = EndpointBuilder("birds", ns).model("pytorch-birds", 1).replicas(2).obj()
    k8s.apply(body, field_manager="test")
    preparing = phase(ns, "Preparing")
    assert "model://pytorch-birds/1" in preparing["status"]["message"]
    job = fetch_job(ns, "model://pytorch-birds/1")
    fetcher = job["spec"]["template"]["spec"]
    assert fetcher["serviceAccountName"] == "default"  # the endpoint's reader
    assert fetcher["automountServiceAccountToken"] is False
    assert serving_pods(ns) == []  # nothing serves before the model is in the cache
    fetched(cluster, ns, job, 1)

    ready = phase(ns, "Ready")
    st = ready["status"]
    assert st["model"] == {"name": "pytorch-birds", "version": 1}
    assert st["scoringUri"] == f"http://birds.{ns}.svc/score"
    assert (st["replicas"], st["readyReplicas"]) == (2, 2)
    deployment = k8s.get(k8s.DEPLOYMENTS, ns, "birds")
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "OnlineEndpoint"
    service = k8s.get(k8s.SERVICES, ns, "birds")
    assert service["spec"]["selector"] == {names.LABEL_ENDPOINT: "birds"}
    pods = serving_pods(ns)
    assert len(pods) == 2
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["AZUREML_MODEL_DIR"] == plans.model_dir("pytorch-birds", 1)
        assert (
            env[contract.ACCESS_URL] == f"{REGISTRY_URL}/v1/namespaces/{ns}/endpoints/birds/access"
        )
        mount = next(
            m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "inputs-cache"
        )
        assert mount["readOnly"] is True and mount["subPath"].startswith("entries/")

    k8s.apply(
        EndpointBuilder("birds", ns).model("pytorch-birds", 2).replicas(2).obj(),
        field_manager="test",
    )
    fetched(cluster, ns, fetch_job(ns, "model://pytorch-birds/2"), 2)

    def on_two(status: dict[str, Any]) -> bool:
        return status.get("phase") == "Ready" and status.get("model", {}).get("version") == 2

    wait_status(k8s.ONLINEENDPOINTS, ns, "birds", on_two, timeout=120)
    versions = wait_for(
        "only version 2's Pods",
        lambda: (
            {p["metadata"]["labels"][wire.LABEL_MODEL_VERSION] for p in serving_pods(ns)} == {"2"}
        ),
        timeout=60,
    )
    assert versions


def test_a_canary_gets_a_deployment_of_its_own_until_the_split_ends(
    cluster: Cluster, prepared: str
) -> None:
    ns = prepared
    canary = EndpointBuilder("birds", ns).model("pytorch-birds", 2).replicas(4).public()
    canary.traffic(v1=50, v2=50)
    k8s.apply(canary.obj(), field_manager="test")
    for version in (1, 2):
        fetched(cluster, ns, fetch_job(ns, f"model://pytorch-birds/{version}"), version)
    ready = phase(ns, "Ready")
    shares = {
        v["version"]: (v["percent"], v["deployment"], v["readyReplicas"])
        for v in ready["status"]["versions"]
    }
    assert shares == {2: (50, "birds", 2), 1: (50, "birds-canary", 2)}
    pods = serving_pods(ns)
    assert sorted(p["metadata"]["labels"][wire.LABEL_TRACK] for p in pods) == [
        "canary", "canary", "primary", "primary",
    ]  # fmt: skip
    assert all(
        contract.ACCESS_URL not in {e["name"] for e in p["spec"]["containers"][0]["env"]}
        for p in pods
    )  # public: no token is asked for
    promoted = EndpointBuilder("birds", ns).model("pytorch-birds", 2).replicas(4).public()
    k8s.apply(promoted.obj(), field_manager="test")
    wait_for(
        "the canary's Deployment gone",
        lambda: k8s.get_or_none(k8s.DEPLOYMENTS, ns, "birds-canary") is None,
        timeout=60,
    )


# -- who may call a private endpoint: the registry's answer, through the serving runtime ----


def caller_token(ns: str, account: str, get_on: str | None) -> str:
    """A token of ServiceAccount ``account`` bound to endpoint ``ns/birds``'s audience;
    with ``get_on`` (a namespace), a Role there that lets it get endpoint birds."""
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": ns},
        }
    )
    if get_on is not None:
        rule = {
            "apiGroups": [api.GROUP],
            "resources": ["onlineendpoints"],
            "verbs": ["get"],
            "resourceNames": ["birds"],
        }
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"call-{account}", "namespace": get_on},
            "rules": [rule],
        }
        k8s.create(role)
        binding = role_binding(get_on, f"call-{account}", f"call-{account}", account)
        binding["subjects"][0]["namespace"] = ns
        k8s.create(binding)
    return k8s.request_token(ns, account, [wire.endpoint_audience(get_on or ns, "birds")])


@pytest.fixture
def registry(tmp_path: Path, cluster: Cluster) -> Iterator[Service]:
    svc = Service(tmp_path / "registry")
    yield svc
    svc.stop()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_private_endpoint_lets_in_who_may_get_it_and_no_one_else(
    cluster: Cluster, namespace: str, registry: Service, tmp_path: Path
) -> None:
    ns = namespace
    other = cluster.create_namespace(f"{ns[:50]}-other")
    try:
        allowed = caller_token(ns, "caller", ns)
        stranger = caller_token(ns, "stranger", None)
        # another namespace's ServiceAccount, bound to this endpoint's audience, with get on
        # endpoints of its own namespace only
        wait_for(
            "the other namespace's default ServiceAccount",
            lambda: k8s.get_or_none(k8s.SERVICEACCOUNTS, other, "default"),
        )
        elsewhere = k8s.request_token(other, "default", [wire.endpoint_audience(ns, "birds")])
        wrong_audience = k8s.request_token(ns, "caller", [wire.REGISTRY_AUDIENCE])
        access = f"/v1/namespaces/{ns}/endpoints/birds/access"
        assert registry.call("GET", access, allowed)[0] == 200
        assert registry.call("GET", access, stranger)[0] == 403
        assert registry.call("GET", access, wrong_audience)[0] == 401
        assert registry.call("GET", access, None)[0] == 401

        (tmp_path / "score.py").write_text(
            "def init(): pass\ndef run(raw_data): return {'ok': True}\n"
        )
        port = _port()
        process = subprocess.Popen(
            [sys.executable, "-m", "torchyard.serving"],
            cwd=tmp_path,
            env={
                **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME")},
                "PYTHONPATH": str(OPERATOR),
                contract.PORT_VARIABLE: str(port),
                contract.ENTRY_SCRIPT: "score.py",
                contract.ACCESS_URL: registry.url + access,
                contract.TERMINATION_LOG: str(tmp_path / "termination-log"),
                contract.MAX_BODY_BYTES: str(LIMIT),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for("the serving process ready", lambda: _status(port, contract.READY_PATH) == 200)
            assert _status(port, "/score", allowed) == 200
            assert _status(port, "/score", stranger) == 403
            assert _status(port, "/score", elsewhere) == 403  # a token of another namespace
            assert _status(port, "/score", wrong_audience) == 401
            assert _status(port, "/score", None) == 401
            # a body over the limit: 413 whether its length is said or it is streamed, and
            # a caller without a token is refused before any of it is read
            big = b'{"x": "' + b"a" * LIMIT + b'"}'
            assert _status(port, "/score", allowed, big) == 413
            assert _status(port, "/score", allowed, big, chunked=True) == 413
            assert _status(port, "/score", None, big) == 401
            assert _status(port, "/score", elsewhere, big, chunked=True) == 403
            assert _status(port, "/score", allowed) == 200  # and it still serves
        finally:
            process.terminate()
            process.communicate(timeout=30)
    finally:
        cluster.delete_namespace(other)


def _status(
    port: int, path: str, token: str | None = None, body: bytes = b"{}", chunked: bool = False
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        method = "POST" if path == "/score" else "GET"
        if method == "POST" and chunked:  # no Content-Length: the server counts as it reads
            pieces = (body[i : i + 4096] for i in range(0, len(body), 4096))
            conn.request(method, path, body=pieces, headers=headers, encode_chunked=True)
        else:
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        time.sleep(0.1)
        return 0
    finally:
        conn.close()


def test_an_endpoint_named_as_a_training_run_waits_for_the_runs_service_name(
    prepared: str,
) -> None:
    ns = prepared
    k8s.create(TrainingRunBuilder("birds", ns).environment("pytorch").pool("cpu").obj())
    theirs = wait_for(
        "the run's headless Service", lambda: k8s.get_or_none(k8s.SERVICES, ns, "birds"), 60
    )
    k8s.apply(EndpointBuilder("birds", ns).model("pytorch-birds", 1).obj(), field_manager="test")
    pending = wait_status(
        k8s.ONLINEENDPOINTS,
        ns,
        "birds",
        lambda s: s.get("phase") == "Pending" and "already exists" in s.get("message", ""),
    )["status"]
    assert (
        "Service birds (the scoring URI's host) already exists and belongs to "
        in (pending["message"])
    )
    assert "TrainingRun birds" in pending["message"], pending
    service = k8s.get(k8s.SERVICES, ns, "birds")  # the run's, as it was
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == theirs["spec"]["selector"]
    assert [o["kind"] for o in service["metadata"]["ownerReferences"]] == ["TrainingRun"]

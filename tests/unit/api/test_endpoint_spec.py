"""The OnlineEndpoint spec's rules (torchyard.api.endpoints), the Python twins of the CEL
rules the CRD carries (the same table runs on a real apiserver in
tests/integration/test_endpoints.py): hostile models, entry scripts, traffic splits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import EndpointBuilder
from torchyard import api

# (what, path, value, what the refusal says): each a spec a user might write
REFUSED: list[tuple[str, str, Any, str]] = [
    (
        "a model URI climbing out of the registry",
        "spec.model",
        {"uri": "model://../ns-b/1"},
        "model://<model>/<version>",
    ),
    (
        "a model URI with a path after it",
        "spec.model",
        {"uri": "model://birds/1/../../x"},
        "nothing after it",
    ),
    ("a model URI without a version", "spec.model", {"uri": "model://birds"}, "at one version"),
    ("another scheme", "spec.model", {"uri": "https://example.com/model.pt"}, "model://"),
    ("an encoded climb", "spec.model", {"uri": "model://%2e%2e/1"}, "model://"),
    ("both a uri and a sweep", "spec.model", {"uri": "model://a/1", "sweep": "s"}, "exactly one"),
    ("neither", "spec.model", {}, "exactly one"),
    ("an entry script outside the code", "spec.entryScript", "../../etc/x.py", "no '..'"),
    ("an absolute entry script", "spec.entryScript", "/etc/score.py", "entryScript"),
    ("an entry script that is not Python", "spec.entryScript", "score.sh", "entryScript"),
    ("a split that is not 100", "spec.traffic", {"1": 50, "2": 40}, "add up to 100"),
    ("a split without the model's version", "spec.traffic", {"3": 50, "2": 50}, "one of them"),
    ("three versions", "spec.traffic", {"1": 50, "2": 25, "3": 25}, "at most 2"),
    ("a key that is no version", "spec.traffic", {"1": 50, "x": 50}, "traffic"),
    ("a share over 100", "spec.traffic", {"1": 150}, "less than or equal to 100"),
    (
        "the runtime's variables",
        "spec.env",
        [{"name": "AZUREML_MODEL_DIR", "value": "/"}],
        "serving runtime sets",
    ),
    (
        "torchyard's variables",
        "spec.env",
        [{"name": "TORCHYARD_ENDPOINT_ACCESS_URL", "value": "x"}],
        "TORCHYARD_",
    ),
    ("too little memory", "spec.resources", {"memory": "1Mi"}, "at least 64Mi"),
    ("no replicas", "spec.replicas", 0, "greater than or equal to 1"),
    (
        "a min above the max",
        "spec.autoscaling",
        {"minReplicas": 3, "maxReplicas": 2},
        "must not exceed",
    ),
    ("autoscaling without CPU", "spec.autoscaling", {"maxReplicas": 3}, "needs resources.cpu"),
    (
        "a body limit too small",
        "spec.limits",
        {"maxBodyBytes": 10},
        "greater than or equal to 1024",
    ),
    ("an unknown backend", "spec.backend", "Knative", "Deployment"),
    ("root", "spec.runAsUser", 0, "greater than or equal to 1"),
]


@pytest.mark.parametrize("what, path, value, said", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_hostile_or_broken_spec_is_refused_naming_the_rule(
    what: str, path: str, value: Any, said: str
) -> None:
    body = EndpointBuilder("birds", "a").set(path, value).obj()
    with pytest.raises(api.InvalidSpec, match=said.replace("(", r"\(").replace(")", r"\)")):
        api.parse_endpoint(body)


def test_canary_with_autoscaling_or_kserve_is_refused() -> None:
    canary = EndpointBuilder("birds", "a").model("birds", 2).traffic(v1=90, v2=10)
    with pytest.raises(api.InvalidSpec, match="do not go together"):
        api.parse_endpoint(
            canary.set("spec.resources", {"cpu": "1"})
            .set("spec.autoscaling", {"maxReplicas": 3})
            .obj()
        )
    with pytest.raises(api.InvalidSpec, match="KServe takes no traffic"):
        api.parse_endpoint(
            EndpointBuilder("birds", "a")
            .model("birds", 2)
            .traffic(v1=90, v2=10)
            .set("spec.backend", "KServe")
            .obj()
        )


@pytest.mark.parametrize("name", ["Birds", "9birds", "b" * 51, "birds.v1"])
def test_the_name_must_fit_its_deployments_and_service(name: str) -> None:
    with pytest.raises(api.InvalidSpec, match="DNS-1035 label"):
        api.parse_endpoint(EndpointBuilder(name, "a").obj())


def test_a_good_spec_gets_the_defaults() -> None:
    ep = api.parse_endpoint(EndpointBuilder("birds", "a").model("pytorch-birds", 2).obj())
    spec = ep.spec
    assert spec.model.name_and_version == ("pytorch-birds", 2)
    assert (spec.replicas, spec.public, spec.backend, spec.run_as_user) == (
        1,
        False,
        "Deployment",
        1000,
    )
    assert spec.limits.max_body_bytes == 16 * 2**20 and spec.limits.request_timeout_seconds == 60
    assert spec.service_account_name == "default" and spec.source.config_map == "birds-score"
    canary = EndpointBuilder("birds", "a").model("pytorch-birds", 2).traffic(v1=90, v2=10).obj()
    assert api.parse_endpoint(canary).spec.traffic == {"1": 90, "2": 10}
    swept = api.parse_endpoint(EndpointBuilder("birds", "a").sweep("tune").obj())
    assert swept.spec.model.name_and_version is None and swept.spec.model.sweep == "tune"

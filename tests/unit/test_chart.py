"""The Helm chart without a cluster or a Helm binary: its CRDs and the GitOps example's are
the generated ones, values.yaml satisfies its strict schema, and the Argo CD health
checks (Lua, run here by Lua 5.1 as Argo CD's gopher-lua is) judge the status objects
that torchyard's own pure status functions compute.

Rendering the chart needs the Helm binary: those tests are in
``tests/integration/test_chart.py``. ``python -m tests.unit.test_chart`` regenerates
``charts/torchyard/health/argocd-cm-patch.yaml`` from the Lua files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

import torchyard
from tests.builders import EndpointBuilder, TrainingRunBuilder, environment, model_version, pod
from torchyard import api, status
from torchyard.launch import contract
from torchyard.status import endpoints as endpoint_status
from torchyard.status.failures import first_failure
from torchyard.status.inputs import InputsObserved
from torchyard.status.trainingruns import Observed

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "torchyard"
HEALTH = CHART / "health"
GITOPS = REPO / "examples" / "gitops"
KINDS = ("TrainingRun", "Environment", "ModelVersion", "OnlineEndpoint")
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


# -- copies of generated files ----------------------------------------------------------


def test_the_chart_ships_the_generated_crds_byte_for_byte() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert generated, "no CRDs in crds/"
    for name in generated:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/torchyard/crds/{name} differs from crds/{name}: cp crds/*.yaml "
            "charts/torchyard/crds/"
        )
    # Besides torchyard's own, only Kopf's peering CRDs (for operator.peering).
    shipped = sorted(p.name for p in (CHART / "crds").iterdir())
    assert shipped == sorted([*generated, "kopf-peerings.yaml"])


def test_the_gitops_example_holds_copies_of_the_crds_and_of_the_ddp_script() -> None:
    for crd in (REPO / "crds").glob("*.yaml"):
        assert (GITOPS / "crds" / crd.name).read_bytes() == crd.read_bytes(), crd.name
    assert (GITOPS / "ddp" / "train.py").read_bytes() == (
        REPO / "examples" / "ddp" / "train.py"
    ).read_bytes()
    kustomization = yaml.safe_load((GITOPS / "kustomization.yaml").read_text())
    crd_files = sorted(r for r in kustomization["resources"] if r.startswith("crds/"))
    assert crd_files == sorted(f"crds/{p.name}" for p in (REPO / "crds").glob("*.yaml"))


def test_the_chart_app_version_is_torchyards_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == torchyard.__version__


# -- values and their schema ------------------------------------------------------------


def _schema_node(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if ref:
        target: Any = schema
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return dict(target)
    return node


JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def _conforms(schema: Mapping[str, Any], node: Mapping[str, Any], value: Any, at: str) -> None:
    """The parts of draft-07 the chart's schema uses: type, properties,
    additionalProperties: false, required, items, enum, minimum, maximum."""
    node = _schema_node(schema, node)
    types = node.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else types
        ok = any(
            isinstance(value, JSON_TYPES[t]) and not (t == "integer" and isinstance(value, bool))
            for t in allowed
        )
        assert ok, f"{at}: {value!r} is not {types}"
    if "enum" in node:
        assert value in node["enum"], f"{at}: {value!r} not in {node['enum']}"
    if "minimum" in node:
        assert value >= node["minimum"], f"{at}: {value} < {node['minimum']}"
    if "maximum" in node:
        assert value <= node["maximum"], f"{at}: {value} > {node['maximum']}"
    if isinstance(value, dict):
        props = node.get("properties", {})
        for key in node.get("required", []):
            assert key in value, f"{at}: {key} is required"
        for key, item in value.items():
            if key in props:
                _conforms(schema, props[key], item, f"{at}.{key}")
            elif isinstance(node.get("additionalProperties"), dict):
                _conforms(schema, node["additionalProperties"], item, f"{at}.{key}")
            else:
                assert node.get("additionalProperties", True) is not False, (
                    f"{at}.{key} is in values.yaml but not in values.schema.json"
                )
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _conforms(schema, node["items"], item, f"{at}[{i}]")


def test_values_schema_is_strict_draft_07_and_describes_every_default_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(values), "a value without schema, or vice versa"
    _conforms(schema, schema, values, "values")
    operator = schema["properties"]["operator"]["properties"]
    assert operator["replicas"] == {"type": "integer", "minimum": 1}
    assert operator["runAsUser"]["minimum"] == 1  # never root
    persistence = schema["properties"]["registry"]["properties"]["persistence"]["properties"]
    assert persistence["accessMode"]["enum"] == [
        "ReadWriteOnce",
        "ReadWriteMany",
        "ReadWriteOncePod",
    ]


def test_the_schema_check_here_rejects_what_helm_would() -> None:
    """The walker above is not vacuous: it refuses the values the integration test feeds
    Helm (a replica count as a word, an unknown top-level key, a root user)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for bad in (
        {**values, "operator": {**values["operator"], "replicas": "two"}},
        {**values, "replica": 2},
        {**values, "operator": {**values["operator"], "runAsUser": 0}},
    ):
        with pytest.raises(AssertionError):
            _conforms(schema, schema, bad, "values")


def test_the_registry_serves_tls_by_default_and_the_schema_checks_its_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tls = values["registry"]["tls"]
    assert tls["enabled"] is True
    assert tls["certManager"]["enabled"] is False  # renders without cert-manager's CRDs
    assert tls["existingSecret"] == ""
    for bad in (
        {**tls, "enabled": "yes"},
        {**tls, "certManager": {**tls["certManager"], "issuerRef": {"kind": "Vault"}}},
        {**tls, "validityDays": 0},
        {**tls, "secret": "mine"},
    ):
        with pytest.raises(AssertionError):
            _conforms(
                schema, schema, {**values, "registry": {**values["registry"], "tls": bad}}, "v"
            )


def test_the_default_log_limit_is_the_launchers_within_the_specs_bounds() -> None:
    """operator.defaultLogLimitBytes: what a run without spec.policy.logLimitBytes gets;
    the chart's default changes nothing, and the schema refuses what the spec would."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["defaultLogLimitBytes"] == contract.LOG_LIMIT_BYTES
    field = schema["properties"]["operator"]["properties"]["defaultLogLimitBytes"]
    assert (field["minimum"], field["maximum"]) == (
        contract.LOG_LIMIT_MIN,
        contract.LOG_LIMIT_MAX,
    )
    for bad in (4095, contract.LOG_LIMIT_MAX + 1, "64Mi", 0, None):
        operator = {**values["operator"], "defaultLogLimitBytes": bad}
        with pytest.raises(AssertionError):
            _conforms(schema, schema, {**values, "operator": operator}, "values")


# -- what the RBAC says about itself --------------------------------------------------------


def _comment_before(text: str, anchor: str) -> str:
    """The comment block that ends just above ``anchor``."""
    lines = text[: text.index(anchor)].rstrip("\n").splitlines()
    block: list[str] = []
    for line in reversed(lines):
        if not line.strip() or not line.lstrip().startswith("#"):
            break
        block.insert(0, line.lstrip("# "))
    return " ".join(block)


def test_the_rbac_says_what_creating_pods_implies_and_recommends_watch_namespaces() -> None:
    """No "cannot read Secrets" claim: creating Pods in a namespace is reading its Secrets
    (mount one, print it), so the chart says so and recommends watchNamespaces.
    tests/integration/test_rbac.py proves the claim against the apiserver."""
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    header = rbac[: rbac.index("*/}}")]
    assert "no Secret reads" not in header
    for said in ("creates", "Pods", "Secret", "effectively read", "watchNamespaces"):
        assert said in header, said
    values = (CHART / "values.yaml").read_text()
    about = _comment_before(values, "watchNamespaces: []")
    assert "Recommended in production" in about and "Secrets" in about
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert "Recommended in production" in schema["properties"]["watchNamespaces"]["description"]
    chart_readme = (CHART / "README.md").read_text()
    assert "Secrets are never readable cluster-wide" not in chart_readme
    assert "effectively read" in chart_readme
    security = " ".join((REPO / "docs" / "operations" / "security.md").read_text().split())
    for said in ("effectively read", "In production set `watchNamespaces`", "torchyard-registry"):
        assert said in security, said


# -- Argo CD health checks --------------------------------------------------------------


def health(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """Run charts/torchyard/health/<kind>.lua as Argo CD does: ``obj`` a global table,
    the chunk returns ``hs``."""
    from lupa.lua51 import LuaRuntime  # Argo CD's gopher-lua is Lua 5.1

    lua = LuaRuntime()
    lua.globals().obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    hs = lua.execute((HEALTH / f"{kind}.lua").read_text())
    result = {"status": hs["status"], "message": hs["message"]}
    assert result["status"] in ("Healthy", "Progressing", "Degraded", "Suspended"), result
    return result


def _run(generation: int = 3, **spec: Any) -> dict[str, Any]:
    """A 2x2 run; ``spec`` sets more fields by dotted path (``{"spec.policy.x": 1}``)."""
    builder = TrainingRunBuilder("r").nodes(2).procs(2)
    for path, value in spec.items():
        builder = builder.with_(path, value)
    body = builder.obj()
    body["metadata"]["generation"] = generation
    return body


def _with_status(body: dict[str, Any], observed: Observed) -> dict[str, Any]:
    run = api.parse_trainingrun(body)
    # The failure, as the controller's failure policy finds it and passes it on.
    observed = replace(observed, failure=observed.failure or first_failure(observed.pods))
    return {**body, "status": status.trainingrun_status(run, observed, None, T0)}


READY_ENV = {"status": {"phase": "Ready", "image": "img@sha256:" + "0" * 64}}
RUNNING = [pod("r", i, phase="Running", node_name=f"n{i}") for i in range(2)]
SUCCEEDED = [pod("r", i, phase="Succeeded", node_name=f"n{i}", exit_code=0) for i in range(2)]
FAILED_RANK_3 = [
    pod("r", 0, phase="Running", node_name="n0"),
    pod(
        "r",
        1,
        phase="Failed",
        node_name="n1",
        exit_code=1,
        message=json.dumps(
            {
                "rank": 3,
                "nodeRank": 1,
                "exitCode": 1,
                "reason": "Error",
                "message": "Traceback (most recent call last):\nRuntimeError: loss is NaN",
            }
        ),
    ),
]

REGISTER = {"spec.outputs.register": {"model": "birds", "path": "outputs"}}
TRAININGRUN_TABLE: list[tuple[str, Observed, dict[str, Any], str, str]] = [
    ("environment missing", Observed(environment=None), {}, "Progressing", "does not exist"),
    (
        "environment building",
        Observed(environment={"status": {"phase": "Building"}}),
        {},
        "Progressing",
        "is Building",
    ),
    ("node Pods being created", Observed(environment=READY_ENV), {}, "Progressing", "0/2"),
    (
        "gang waiting for capacity",
        Observed(
            environment=READY_ENV,
            pods=[pod("r", i, gated=True) for i in range(2)],
            queued_message="needs 2 node(s) with 2 nvidia.com/gpu in pool a100; 1 fit now",
        ),
        {},
        "Suspended",
        "1 fit now",
    ),
    ("all ranks running", Observed(environment=READY_ENV, pods=RUNNING), {}, "Progressing", "2/2"),
    (
        "registering the model",
        Observed(environment=READY_ENV, pods=SUCCEEDED, finalized=False),
        REGISTER,
        "Progressing",
        "registering the model",
    ),
    (
        "succeeded with a model",
        Observed(environment=READY_ENV, pods=SUCCEEDED, model={"name": "birds", "version": 4}),
        REGISTER,
        "Healthy",
        "registered model birds version 4",
    ),
    (
        "rank 3 failed",
        Observed(environment=READY_ENV, pods=FAILED_RANK_3),
        {},
        "Degraded",
        "rank 3 (node 1) failed (Error, exit code 1): RuntimeError: loss is NaN",
    ),
    (
        "environment failed",
        Observed(environment={"status": {"phase": "Failed", "message": "pip: no torch==9"}}),
        {},
        "Degraded",
        "pip: no torch==9",
    ),
    (
        "deadline exceeded",
        Observed(environment=READY_ENV, pods=RUNNING, deadline_exceeded=True),
        {"spec.policy.activeDeadlineSeconds": 600},
        "Degraded",
        "the run exceeded activeDeadlineSeconds (600s)",
    ),
]


@pytest.mark.parametrize(
    "observed, spec, expected, words",
    [row[1:] for row in TRAININGRUN_TABLE],
    ids=[row[0] for row in TRAININGRUN_TABLE],
)
def test_trainingrun_health(
    observed: Observed, spec: dict[str, Any], expected: str, words: str
) -> None:
    obj = _with_status(_run(**spec), observed)
    result = health("TrainingRun", obj)
    assert result["status"] == expected, (obj["status"]["phase"], result)
    assert words in result["message"]


def test_trainingrun_health_without_status_or_with_an_unobserved_spec_is_progressing() -> None:
    body = _run()
    assert health("TrainingRun", body)["status"] == "Progressing"
    observed = _with_status(_run(generation=3), Observed(environment=READY_ENV, pods=RUNNING))
    observed["metadata"]["generation"] = 4  # edited after the operator's last status
    assert health("TrainingRun", observed) == {
        "status": "Progressing",
        "message": "Waiting for the operator to observe generation 4",
    }


def test_trainingrun_health_of_a_restarting_gang_says_why() -> None:
    """A restart writes phase Pending with Running=False/Restarting (trainingruns._restart)."""
    obj = _with_status(_run(), Observed(environment=READY_ENV, pods=RUNNING))
    obj["status"]["phase"] = "Pending"
    obj["status"]["conditions"] = status.merge(
        obj["status"]["conditions"],
        [c for c in obj["status"]["conditions"] if c["type"] not in ("Running", "Admitted")]
        + [status.condition("Running", False, "Restarting", "restarting the gang (restart 1)")],
        T0,
    )
    assert health("TrainingRun", obj) == {
        "status": "Progressing",
        "message": "restarting the gang (restart 1)",
    }


def test_an_invalid_trainingrun_is_degraded() -> None:
    obj = {
        **_run(),
        "status": status.invalid_trainingrun_status(3, "command must not be empty", None, T0),
    }
    assert health("TrainingRun", obj) == {
        "status": "Degraded",
        "message": "command must not be empty",
    }


def _environment(spec: dict[str, Any], build: status.BuildObserved | None) -> dict[str, Any]:
    body = environment("pytorch", "team", **spec)
    body["metadata"]["generation"] = 1
    env = api.parse_environment(body)
    return {**body, "status": status.environment_status(env, None, T0, build)}


BUILD_SPEC = {
    "baseImage": "python:3.11-slim",
    "pip": ["torch"],
    "registry": {"repository": "registry.local:5000/envs"},
}
ENVIRONMENT_TABLE: list[tuple[str, dict[str, Any], status.BuildObserved | None, str, str]] = [
    ("curated", {"image": "ghcr.io/acme/pytorch:2.15"}, None, "Healthy", "prebuilt image"),
    (
        "cached in the registry",
        BUILD_SPEC,
        status.BuildObserved("sha256:1", image="registry.local:5000/envs@sha256:2"),
        "Healthy",
        "found in the registry",
    ),
    (
        "building",
        BUILD_SPEC,
        status.BuildObserved("sha256:1", job="env-build-1", job_state="Running"),
        "Progressing",
        "build Job env-build-1 is building the image",
    ),
    ("waiting for the build plan", BUILD_SPEC, None, "Progressing", "waiting for the build"),
    (
        "build failed",
        BUILD_SPEC,
        status.BuildObserved(
            "sha256:1",
            job="env-build-1",
            job_state="Failed",
            job_message="ERROR: No matching distribution found for torch==9",
        ),
        "Degraded",
        "No matching distribution found for torch==9",
    ),
]


@pytest.mark.parametrize(
    "spec, build, expected, words",
    [row[1:] for row in ENVIRONMENT_TABLE],
    ids=[row[0] for row in ENVIRONMENT_TABLE],
)
def test_environment_health(
    spec: dict[str, Any], build: status.BuildObserved | None, expected: str, words: str
) -> None:
    obj = _environment(spec, build)
    result = health("Environment", obj)
    assert result["status"] == expected, (obj["status"]["phase"], result)
    assert words in result["message"]


def test_environment_health_invalid_unobserved_and_new() -> None:
    body = environment("pytorch", "team", image="x")
    assert health("Environment", body)["status"] == "Progressing"
    invalid = {**body, "status": status.invalid_environment_status(1, "bad spec", None, T0)}
    assert health("Environment", invalid) == {"status": "Degraded", "message": "bad spec"}
    stale = _environment({"image": "ghcr.io/acme/pytorch:2.15"}, None)
    stale["metadata"]["generation"] = 2
    assert health("Environment", stale)["status"] == "Progressing"


def test_modelversion_health() -> None:
    mv = model_version("birds-v2", "team", "birds", 2)
    assert health("ModelVersion", mv) == {
        "status": "Healthy",
        "message": "Model birds version 2 (3 B, 1 file(s))",
    }
    unavailable = {
        **mv,
        "status": {
            "conditions": [
                status.condition("Available", False, "Missing", "files missing on the volume")
            ]
        },
    }
    assert health("ModelVersion", unavailable) == {
        "status": "Degraded",
        "message": "files missing on the volume",
    }
    available = {
        **mv,
        "status": {"conditions": [status.condition("Available", True, "Verified", "verified")]},
    }
    assert health("ModelVersion", available) == {"status": "Healthy", "message": "verified"}


def _endpoint(observed: endpoint_status.EndpointObserved) -> dict[str, Any]:
    body = EndpointBuilder("birds", "team").model("pytorch-birds", 2).obj()
    body["metadata"]["generation"] = 1
    ep = api.parse_endpoint(body)
    return {**body, "status": endpoint_status.endpoint_status(ep, observed, {}, T0)}


def _serving(ready: int, rolled: bool = True, pods: list[Any] | None = None) -> Any:
    load = endpoint_status.Workload("primary", 2, 100, "birds", 2, ready, 2, rolled)
    entries = [{"name": "model_v2", "uri": "model://pytorch-birds/2", "key": "k"}]
    return endpoint_status.EndpointObserved(
        model=("pytorch-birds", 2),
        inputs=InputsObserved(entries),
        workloads=[load],
        pods=pods or [],
    )


INIT_FAILED_POD = {
    "metadata": {"name": "birds-x"},
    "status": {
        "containerStatuses": [
            {
                "name": "scorer",
                "ready": False,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 3,
                        "message": json.dumps(
                            {"reason": "InitFailed", "message": "KeyError: 'state_dict'"}
                        ),
                    }
                },
            }
        ]
    },
}
ENDPOINT_TABLE: list[tuple[str, Any, str, str]] = [
    (
        "waiting for its environment",
        endpoint_status.EndpointObserved(
            waiting=("EnvironmentNotReady", "Environment pytorch is not ready")
        ),
        "Progressing",
        "not ready",
    ),
    (
        "fetching its model",
        endpoint_status.EndpointObserved(
            model=("m", 2), inputs=InputsObserved([], {"model_v2": "fetching model://m/2"})
        ),
        "Progressing",
        "fetching",
    ),
    ("deploying", _serving(0), "Progressing", "0/2 Pods ready"),
    ("rolling out", _serving(1, rolled=False), "Progressing", "rolling out"),
    ("serving", _serving(2), "Healthy", "2/2 Pods serve"),
    (
        "init() raised, nothing serves",
        _serving(0, pods=[INIT_FAILED_POD]),
        "Degraded",
        "PythonException",
    ),
    (
        "init() raised beside serving Pods",
        _serving(1, rolled=False, pods=[INIT_FAILED_POD]),
        "Degraded",
        "1/2 Pods serve",
    ),
]


@pytest.mark.parametrize(
    "observed, expected, words",
    [row[1:] for row in ENDPOINT_TABLE],
    ids=[row[0] for row in ENDPOINT_TABLE],
)
def test_onlineendpoint_health(observed: Any, expected: str, words: str) -> None:
    result = health("OnlineEndpoint", _endpoint(observed))
    assert result["status"] == expected, result
    assert words in result["message"], result


def render_argocd_cm_patch() -> str:
    """argocd-cm's resource.customizations.health.<group>_<kind> keys, one per Lua file."""
    lines = [
        "# Argo CD health checks of torchyard's resources: merge into the argocd-cm ConfigMap",
        "#   kubectl -n argocd patch configmap argocd-cm --patch-file argocd-cm-patch.yaml",
        "# Generated from the *.lua files beside it by `python -m tests.unit.test_chart`;",
        "# tests/unit/test_chart.py checks that it matches them.",
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata:",
        "  name: argocd-cm",
        "  namespace: argocd",
        "data:",
    ]
    for kind in KINDS:
        lines.append(f"  resource.customizations.health.{api.GROUP}_{kind}: |")
        lines += [
            f"    {line}" if line else ""
            for line in (HEALTH / f"{kind}.lua").read_text().splitlines()
        ]
    return "\n".join(lines) + "\n"


def test_the_argocd_cm_patch_holds_exactly_the_lua_files() -> None:
    path = HEALTH / "argocd-cm-patch.yaml"
    assert path.read_text() == render_argocd_cm_patch(), "python -m tests.unit.test_chart"
    data = yaml.safe_load(path.read_text())["data"]
    assert data == {
        f"resource.customizations.health.torchyard.dev_{kind}": (HEALTH / f"{kind}.lua").read_text()
        for kind in KINDS
    }


if __name__ == "__main__":
    (HEALTH / "argocd-cm-patch.yaml").write_text(render_argocd_cm_patch())
    print(f"wrote {HEALTH / 'argocd-cm-patch.yaml'}", file=sys.stderr)

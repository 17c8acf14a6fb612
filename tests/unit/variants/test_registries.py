"""A variant is one module plus its registration. The throwaway early-termination policy,
parameter expression and input scheme below are registered by this test module alone (no
torchyard file knows them): the generated CRDs and their reference pages show their types,
fields and rules; a Sweep naming the policy and the expression parses (the SDK's and local
mode's path), the sweeps core judges trials by the policy and samples the expression; a
run with an input of the scheme gets its fetch Job planned and, in local mode, its input
fetched and read by the rank. A registration that lacks a callback, a summary or a
consistent field is refused."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from docs.gen import reference

from tests.builders import SweepBuilder, TrainingRunBuilder
from torchyard import api, cli
from torchyard.api import crds
from torchyard.inputs import schemes
from torchyard.inputs.base import FetchPod, InputError, InputScheme, RegistryService, Source
from torchyard.planning import inputs as planned
from torchyard.sweeps import expressions, policies, sampling, space, stopping
from torchyard.sweeps.expressions.base import (
    MAX_VALUE,
    MIN_VALUE,
    Draws,
    Expression,
    Range,
    Value,
    check_range,
    finite,
)
from torchyard.sweeps.policies.base import (
    SCHEDULE,
    Action,
    Decision,
    Field,
    Goal,
    IntervalPolicy,
    check_integer,
    required,
    scores,
)
from torchyard.tuning import plans

PATIENCE = Field(
    "patience",
    "patience",
    integer=True,
    description="patience: the intervals a trial may go without improving.",
    minimum=1,
    maximum=1000,
    required=True,
)


@dataclass(frozen=True)
class Patience(IntervalPolicy):
    """Stop a trial whose best metric has not improved for ``patience`` intervals."""

    patience: int
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    TYPE = "patience"
    SUMMARY = "stop a trial whose best did not improve for patience intervals"
    FIELDS = (PATIENCE, *SCHEDULE)
    RULES = (required("patience", PATIENCE),)

    def __post_init__(self) -> None:
        check_integer("patience", self.patience, 1)
        self.check_schedule()

    def decide(
        self, goal: Goal, peers: Mapping[int, Sequence[float | None]], trial: int, n: int
    ) -> Decision:
        mine = scores(goal, peers[trial])
        best_at = mine.index(max(mine)) + 1
        stale = n - best_at >= self.patience
        action = Action.STOP if stale else Action.CONTINUE
        return Decision(trial, action, f"its best was at interval {best_at}", n)


@pytest.fixture
def patience() -> Iterator[type[Patience]]:
    policies.register(Patience)
    yield Patience
    policies.unregister(Patience.TYPE)


MODE = expressions.Field("mode", "mode", "number", "triangular: the most likely value.")


@dataclass(frozen=True)
class Triangular(Expression):
    """Triangular between min_value and max_value, peaking at mode."""

    min_value: float
    max_value: float
    mode: float

    TYPE = "triangular"
    SUMMARY = "triangular in [minValue, maxValue], most likely at mode"
    FIELDS = (MIN_VALUE, MAX_VALUE, MODE)

    def __post_init__(self) -> None:
        low, high = finite("minValue", self.min_value), finite("maxValue", self.max_value)
        check_range(low, high)
        if not low <= finite("mode", self.mode) <= high:
            raise space.SpaceError([space.Problem("mode", "must be within the bounds")])

    def draw(self, u: Draws) -> Value:
        low, high, mode = self.min_value, self.max_value, self.mode
        cut = (mode - low) / (high - low)
        x = u(0)
        if x < cut:
            return low + ((high - low) * (mode - low) * x) ** 0.5
        return high - ((high - low) * (high - mode) * (1 - x)) ** 0.5

    def search_range(self) -> Range:
        return Range("float", low=self.min_value, high=self.max_value)


@pytest.fixture
def triangular() -> Iterator[type[Triangular]]:
    expressions.register(Triangular)
    yield Triangular
    expressions.unregister(Triangular.TYPE)


def sweep(early: dict[str, Any]) -> dict[str, Any]:
    trial = TrainingRunBuilder("t").command("python", "train.py")
    return (
        SweepBuilder("s")
        .trial(trial)
        .parameters(lr={"type": "uniform", "minValue": 0.1, "maxValue": 0.2})
        .trials(4)
        .objective("acc")
        .with_("spec.earlyTermination", early)
        .obj()
    )


def sweep_crd() -> dict[str, Any]:
    [kind] = [k for k in crds.KINDS if k.kind == "Sweep"]
    return crds.crd(kind)


def early_termination(crd: Mapping[str, Any]) -> dict[str, Any]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    early: dict[str, Any] = spec["properties"]["earlyTermination"]
    return early


def test_a_registered_policy_is_in_the_generated_crd_and_its_reference(
    patience: type[Patience],
) -> None:
    early = early_termination(sweep_crd())
    assert early["properties"]["patience"]["maximum"] == 1000
    assert (
        "patience: stop a trial whose best did not improve"
        in (early["properties"]["type"]["description"])
    )
    rules = [r["rule"] for r in early["x-kubernetes-validations"]]
    assert rules[0] == "self.type in ['bandit', 'median', 'truncation', 'asha', 'patience']"
    assert "(self.type == 'patience') == has(self.patience)" in rules
    page = reference.crd_page(sweep_crd(), "crds/sweeps.torchyard.dev.yaml")
    assert "`spec.earlyTermination.patience`" in page
    assert "patience: the intervals a trial may go without improving." in page
    # gone with its registration: the CRD is the built-in policies' again
    policies.unregister(Patience.TYPE)
    assert "patience" not in early_termination(sweep_crd())["properties"]
    policies.register(Patience)


def test_a_sweep_with_a_registered_policy_parses_and_its_trials_are_judged_by_it(
    patience: type[Patience],
) -> None:
    parsed = api.parse_sweep(sweep({"type": "patience", "patience": 2}))
    assert parsed.spec.early_termination is not None
    compiled = plans.compile_spec(parsed, sweep({})["spec"]["parameters"])
    assert compiled.policy == Patience(patience=2)
    histories: dict[int, list[float | None]] = {0: [0.5, 0.4, 0.3], 1: [0.1, 0.2, 0.3]}
    assert stopping.evaluate(compiled.policy, Goal.MAXIMIZE, histories, 0).action is Action.STOP
    assert stopping.evaluate(compiled.policy, Goal.MAXIMIZE, histories, 1).action is (
        Action.CONTINUE
    )
    # its rules, twins of the CRD's, refuse what the apiserver refuses
    with pytest.raises(ValueError, match="patience is required by patience"):
        api.parse_sweep(sweep({"type": "patience"}))
    with pytest.raises(ValueError, match="patience is required by patience"):
        api.parse_sweep(sweep({"type": "median", "patience": 2}))


def test_an_unregistered_policy_is_refused_by_the_models() -> None:
    with pytest.raises(ValueError, match=r"earlyTermination\.type must be bandit, median"):
        api.parse_sweep(sweep({"type": "patience"}))
    with pytest.raises(ValueError, match=r"earlyTermination\.patience: not a field of this object"):
        api.parse_sweep(sweep({"type": "patience", "patience": 2}))


def test_registration_refuses_a_policy_without_its_callbacks_or_with_a_clashing_field() -> None:
    @dataclass(frozen=True)
    class NoDecision(IntervalPolicy):
        evaluation_interval: int = 1
        delay_evaluation: int = 0
        TYPE = "nodecision"
        SUMMARY = "decides nothing"
        FIELDS = SCHEDULE

    with pytest.raises(ValueError, match="does not implement decide"):
        policies.register(NoDecision)

    @dataclass(frozen=True)
    class Silent(Patience):
        TYPE = "silent"
        SUMMARY = ""

    with pytest.raises(ValueError, match="no SUMMARY"):
        policies.register(Silent)

    @dataclass(frozen=True)
    class Clash(Patience):
        TYPE = "clash"
        FIELDS = (PATIENCE, Field("evaluationInterval", "evaluation_interval", True, "other"))

    policies.register(Patience)
    try:
        with pytest.raises(ValueError, match="defines evaluationInterval otherwise"):
            policies.register(Clash)
        with pytest.raises(ValueError, match="already registered"):
            policies.register(Patience)
    finally:
        policies.unregister(Patience.TYPE)
    with pytest.raises(ValueError, match="built in"):
        policies.unregister("bandit")


def test_a_registered_expression_is_in_the_generated_crd_parsed_and_sampled(
    triangular: type[Triangular],
) -> None:
    schema = sweep_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    parameter = spec["parameters"]["additionalProperties"]
    assert "triangular" in parameter["properties"]["type"]["enum"]
    assert parameter["properties"]["mode"]["type"] == "number"
    rules = [r["rule"] for r in parameter["x-kubernetes-validations"]]
    assert "has(self.mode) == (self.type in ['triangular'])" in rules
    assert any("'triangular'" in r for r in rules if r.startswith("has(self.minValue)"))
    page = reference.crd_page(sweep_crd(), "crds/sweeps.torchyard.dev.yaml")
    assert "triangular: the most likely value." in page
    body = sweep({})
    body["spec"].pop("earlyTermination")
    body["spec"]["parameters"]["t"] = {
        "type": "triangular",
        "minValue": 0,
        "maxValue": 1,
        "mode": 1,
    }
    parsed = api.parse_sweep(body)
    searched = space.parse_space(body["spec"]["parameters"])
    values = [sampling.trial_parameters("random", searched, 7, i)["t"] for i in range(50)]
    assert all(0 <= v <= 1 for v in values) and sum(values) / 50 > 0.5  # leans to the mode
    sampling.check("bayesian", searched, 4)  # it has a search range
    with pytest.raises(sampling.SamplingError, match="grid sampling takes only choice"):
        sampling.check("grid", searched, 4)
    assert parsed.spec.parameters["t"].type == "triangular"
    with pytest.raises(ValueError, match="mode is required by triangular"):
        del body["spec"]["parameters"]["t"]["mode"]
        api.parse_sweep(body)


def test_registration_refuses_an_expression_without_a_draw() -> None:
    @dataclass(frozen=True)
    class NoDraw(Expression):
        TYPE = "nodraw"
        SUMMARY = "draws nothing"

    with pytest.raises(ValueError, match="does not implement draw"):
        expressions.register(NoDraw)
    with pytest.raises(ValueError, match="built in"):
        expressions.unregister("uniform")


class Generated(InputScheme):
    """``gen://<n>``: n bytes of a counting pattern, made by the fetcher itself."""

    TYPE = "gen"
    SUMMARY = "gen://<bytes> (that many bytes of a counting pattern, made on the spot)"
    FORM = "gen://<bytes>"
    PATTERN = "gen://[0-9]{1,6}"

    def check(self, uri: str, sha256: str) -> None:
        if not uri.removeprefix("gen://").isdigit():
            raise InputError(f"{uri!r}: write gen://<bytes>")

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        size = int(source.uri.removeprefix("gen://"))
        os.makedirs(os.path.join(staging, "data"), exist_ok=True)
        with open(os.path.join(staging, "data", "blob.bin"), "wb") as f:
            f.write(bytes(i % 256 for i in range(size)))
        return size

    def fetch_pod(self, source: Source, namespace: str, registry: RegistryService) -> FetchPod:
        return FetchPod(env=({"name": "GEN_SEED", "value": "7"},))


@pytest.fixture
def generated() -> Iterator[InputScheme]:
    scheme = schemes.register(Generated())
    yield scheme
    schemes.unregister(Generated.TYPE)


READS_THE_BLOB = (
    "import os, pathlib; p = pathlib.Path(os.environ['TORCHYARD_INPUT_BLOB'], 'blob.bin'); "
    "os.makedirs('outputs', exist_ok=True); "
    "pathlib.Path('outputs/size.txt').write_text(str(len(p.read_bytes())))"
)


def test_a_registered_scheme_is_in_the_crd_planned_and_fetched_in_local_mode(
    generated: InputScheme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [kind] = [k for k in crds.KINDS if k.kind == "TrainingRun"]
    crd = crds.crd(kind)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    one = spec["inputs"]["items"]
    uri_rule = one["x-kubernetes-validations"][0]
    assert "|gen://[0-9]{1,6})$" in uri_rule["rule"] and "gen://<bytes>" in uri_rule["message"]
    assert "gen://<bytes> (that many bytes" in one["properties"]["uri"]["description"]
    page = reference.crd_page(crd, "crds/trainingruns.torchyard.dev.yaml")
    assert "gen://&lt;bytes&gt;" in page or "gen://<bytes>" in page
    body = (
        TrainingRunBuilder("blob")
        .command(sys.executable, "-c", READS_THE_BLOB)
        .with_("spec.inputs", [{"name": "blob", "uri": "gen://300"}])
        .obj()
    )
    run = api.parse_trainingrun(body)
    [(_, source)] = planned.fetched(run)
    job = planned.fetch_job("default", source, image="img", cache=planned.CacheSettings(), evict=[])
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "GEN_SEED", "value": "7"} in container["env"]
    with pytest.raises(ValueError, match="write gen://<bytes>"):
        api.parse_trainingrun(
            TrainingRunBuilder("bad").with_("spec.inputs", [{"name": "b", "uri": "gen://x"}]).obj()
        )
    # local mode: fetched into the cache by the scheme's fetcher, read by the rank
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(body))
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    argv = ["run", "run.yaml", "--local", "--workdir", str(runs), "--registry", str(tmp_path / "r")]
    assert cli.main(argv) == 0
    [done] = sorted(runs.iterdir())
    assert (done / "node-0" / "outputs" / "size.txt").read_text() == "300"


def test_registration_refuses_a_fetched_scheme_without_a_fetcher() -> None:
    class NoFetch(InputScheme):
        TYPE = "nofetch"
        SUMMARY = "fetched by nobody"

        def check(self, uri: str, sha256: str) -> None:
            pass

    with pytest.raises(ValueError, match="does not implement fetch"):
        schemes.register(NoFetch())
    with pytest.raises(ValueError, match="built in"):
        schemes.unregister("pvc")

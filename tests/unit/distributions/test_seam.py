"""A distribution type is one module plus its registration. The toy type below
is registered by this test module alone (no torchyard file knows it): the API accepts it,
local mode runs it, and its ranks see what it adds to the rank contract. The built-in
types keep their own parts (the CRD's enum and rules are made from them only), and every
launcher a type selects is registered on the launcher's side."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, distributions, local
from torchyard.api.crds import KINDS, openapi_schema
from torchyard.distributions import Place, PodParts, Rule, Spec
from torchyard.launch.contract import NODE_LAUNCHER, TORCHYARD_DISTRIBUTION
from torchyard.launch.main import LAUNCHERS
from torchyard.planning import pods

# Each rank writes what it saw into its node's outputs.
SHOW_ENV = (
    "import json, os; "
    "os.makedirs('outputs', exist_ok=True); "
    "keys = ('RANK', 'WORLD_SIZE', 'NODE_RANK', 'MASTER_ADDR', 'TOY_FLAVOUR', 'TOY_NODES'); "
    "json.dump({k: os.environ.get(k) for k in keys}, "
    "open('outputs/rank-%s.json' % os.environ['RANK'], 'w'))"
)


class Toy(distributions.DistributionType):
    """A type with a rule of its own, variables for every rank, a port on its Pods, and
    all its nodes' launchers started by local mode (the default)."""

    name = "toy"
    rules = (
        Rule(
            {
                "rule": "self.type != 'toy' || self.nodeCount <= 2",
                "message": "toy: 2 nodes at most",
            },
            lambda d: d.type != "toy" or d.node_count <= 2,
        ),
    )

    def node_env(self, spec: Spec, env: dict[str, str]) -> dict[str, str]:
        return {**env, "TOY_FLAVOUR": "vanilla", "TOY_NODES": str(spec.node_count)}

    def pod_parts(self, spec: Spec, place: Place) -> PodParts:
        return PodParts(ports=({"name": "toy", "containerPort": spec.master_port + 7},))


@pytest.fixture
def toy() -> Iterator[distributions.DistributionType]:
    kind = distributions.register(Toy())
    yield kind
    distributions.unregister(kind.name)


def toy_run(nodes: int = 2, procs: int = 2) -> api.TrainingRun:
    body = (
        TrainingRunBuilder("toyrun")
        .nodes(nodes)
        .procs(procs)
        .command(sys.executable, "-c", SHOW_ENV)
        .with_("spec.distribution.type", "toy")
        .obj()
    )
    return api.parse_trainingrun(body)


def test_an_unregistered_type_is_refused_and_a_registered_one_accepted(
    toy: distributions.DistributionType,
) -> None:
    assert toy_run().spec.distribution.type == "toy"
    distributions.unregister("toy")
    with pytest.raises(api.InvalidSpec, match="'toy' is not one of pytorch, none, mpi"):
        toy_run()
    distributions.register(toy)


def test_a_registered_types_rules_apply(toy: distributions.DistributionType) -> None:
    with pytest.raises(api.InvalidSpec, match="toy: 2 nodes at most"):
        toy_run(nodes=3)


def test_the_crd_knows_the_built_in_types_only(toy: distributions.DistributionType) -> None:
    schema = openapi_schema(next(k for k in KINDS if k.kind == "TrainingRun"))
    dist = schema["properties"]["spec"]["properties"]["distribution"]
    assert dist["properties"]["type"]["enum"] == ["pytorch", "none", "mpi"]
    assert distributions.BUILT_IN == ("pytorch", "none", "mpi")
    assert not any("toy" in r["rule"] for r in dist["x-kubernetes-validations"])


def test_the_planner_asks_the_type_for_its_pod_parts(toy: distributions.DistributionType) -> None:
    run = toy_run()
    container = pods.pod(run, 1, image="img")["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TOY_FLAVOUR"] == "vanilla" and env["NODE_RANK"] == "1"
    assert {"name": "toy", "containerPort": run.spec.distribution.master_port + 7} in container[
        "ports"
    ]


def test_a_toy_run_in_local_mode_gives_its_ranks_the_toys_variables(
    toy: distributions.DistributionType, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    result = local.run_local(
        toy_run(nodes=2, procs=2),
        tmp_path / "src",
        [],
        registry=tmp_path / "registry",
        workroot=tmp_path / "runs",
        out=io.StringIO(),
    )
    assert result.succeeded, result.failure
    seen = {
        rank: json.loads(
            (result.workdir / f"node-{rank // 2}" / f"outputs/rank-{rank}.json").read_text()
        )
        for rank in range(4)
    }
    for rank, env in seen.items():
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["NODE_RANK"] == str(rank // 2)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TOY_FLAVOUR"] == "vanilla" and env["TOY_NODES"] == "2"


def test_every_launcher_a_built_in_type_selects_is_registered_and_reaches_the_node() -> None:
    """A type names its launcher class (``DistributionType.launcher``); the planner puts it
    in the launcher's variables (unset: the node launcher), which the launcher looks up."""
    for name in distributions.BUILT_IN:
        kind = distributions.get(name)
        assert kind.launcher in LAUNCHERS, name
        run = api.parse_trainingrun(
            TrainingRunBuilder("r").with_("spec.distribution.type", name).obj()
        )
        env = pods.launcher_env(run, 0, workdir=".", grace_period=10, attempt="a")
        assert env.get(TORCHYARD_DISTRIBUTION, NODE_LAUNCHER) == kind.launcher, name

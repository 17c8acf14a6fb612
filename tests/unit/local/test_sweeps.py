"""Local sweeps (``local.sweeps``) without processes: what a trial's metrics file says is
read as the controller reads a trial's progress (rank 0's steps from 1 on; a torn last
line waits for its end; lines that are not progress are skipped), and what cannot run is
refused before any trial starts, naming the field. The real runs are in
tests/e2e/test_local_sweeps.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import SweepBuilder, TrainingRunBuilder
from torchyard import api, cli
from torchyard.local import LocalResult
from torchyard.local.sweeps import LocalSweep, Trial
from torchyard.registry import Store


class StubRun:
    """The part of a LocalRun a Trial uses: its node folders, execute, stop."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.release = threading.Event()
        self.stopped = False

    def node_dir(self, node: int) -> Path:
        return self.root / f"node-{node}"

    def execute(self) -> LocalResult:
        self.release.wait(10)
        return LocalResult(143 if self.stopped else 0, self.root, [])

    def _stop_all(self) -> None:
        self.stopped = True
        self.release.set()


def trial(tmp_path: Path) -> tuple[Trial, StubRun, Path]:
    stub = StubRun(tmp_path)
    logs = stub.node_dir(0) / "logs"
    logs.mkdir(parents=True)
    run = api.parse_trainingrun(
        {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "s-t0", "namespace": "default"},
            "spec": SweepBuilder("s").obj()["spec"]["trial"],
        }
    )
    return Trial(0, run, stub), stub, logs / "metrics.jsonl"  # type: ignore[arg-type]


def line(**record: Any) -> str:
    return json.dumps(record) + "\n"


def test_rank_0s_steps_are_read_once_each_and_a_torn_line_waits(tmp_path: Path) -> None:
    found, stub, metrics = trial(tmp_path)
    metrics.write_text(
        line(step=0, best_val_acc=0.1, rank=0)  # before the first interval
        + line(step=1, best_val_acc=0.5, loss=2.0, rank=0)
        + line(step=1, best_val_acc=0.9, rank=1)  # another rank's
        + "not json\n"
        + line(step="2", best_val_acc=0.7, rank=0)  # a step that is not a number
        + line(step=2, best_val_acc="high", rank=0)  # reported, not a number
        + line(step=3, loss=1.0, rank=0)  # no objective metric
        + '{"step": 4, "best_val'  # torn: the rest comes later
    )
    assert found.reports("best_val_acc") == [(1, 0.5), (2, None)]
    assert found.reports("best_val_acc") == []
    with metrics.open("a") as f:
        f.write('_acc": 0.8, "rank": null}\n')
    assert found.reports("best_val_acc") == [(4, 0.8)]
    assert found.metric_names == {"best_val_acc", "loss"}
    stub.release.set()
    found.join()


def test_a_stopped_trial_shows_the_decision_and_gives_its_place_back(tmp_path: Path) -> None:
    from torchyard.planning import sweeps as plans
    from torchyard.tuning.sweep_trials import Entry

    found, stub, _ = trial(tmp_path)
    assert found.running and found.seen(Entry({}), found.running).phase == "Running"
    found.stop(plans.Decision("stopped", "below the slack"))
    found.join()
    shown = found.seen(Entry({}), found.running)
    assert stub.stopped and not found.running
    assert (shown.phase, shown.decision) == (
        "Suspended",
        plans.Decision("stopped", "below the slack"),
    )
    assert not shown.occupies


def sweep_yaml(tmp_path: Path, builder: SweepBuilder) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(builder.obj()))
    return path


@pytest.mark.parametrize(
    ("builder", "extra", "message"),
    [
        (SweepBuilder("s"), ["--parallel", "0"], "--parallel must be at least 1"),
        (
            SweepBuilder("s")
            .with_("spec.sampling", "bayesian")
            .parameters(z={"type": "normal", "mu": 0, "sigma": 1}),
            [],
            "spec.parameters.z: bayesian sampling takes only",
        ),
        (
            SweepBuilder("s")
            .grid()
            .parameters(lr={"type": "uniform", "minValue": 0, "maxValue": 1}),
            [],
            "spec.parameters.lr: grid sampling takes only choice",
        ),
        (SweepBuilder("s").trials(2, 4), [], "maxConcurrentTrials must not exceed"),
        (
            SweepBuilder("s")
            .with_("spec.trial.checkpoints", {"size": "1Gi"})
            .with_("spec.earlyTermination", {"type": "asha", "maxResource": 9}),
            [],
            "asha pauses trials and resumes them later, which local mode does not do",
        ),
    ],
)
def test_what_cannot_run_is_refused_before_any_trial_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    builder: SweepBuilder,
    extra: list[str],
    message: str,
) -> None:
    path = sweep_yaml(tmp_path, builder)
    runs = tmp_path / "runs"
    code = cli.main(
        ["sweep", "submit", str(path), "--local", "--workdir", str(runs),
         "--registry", str(tmp_path / "registry"), *extra]
    )  # fmt: skip
    assert code != 0
    assert message in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())


def test_every_local_trial_starts_from_the_model_version_the_first_one_took(
    tmp_path: Path,
) -> None:
    """A trial that publishes a newer version of the model the sweep's trials start from
    (``model://birds``, no version) does not move the next trials to it."""
    store = Store(tmp_path / "registry")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.pt").write_text("weights")
    store.publish("default", "birds", weights)
    made: list[api.TrainingRun] = []

    def make_run(run: api.TrainingRun) -> StubRun:
        made.append(run)
        store.publish("default", "birds", weights)  # as a trial's outputs.register would
        stub = StubRun(tmp_path / run.name)
        stub.release.set()
        return stub

    base = {"name": "base", "uri": "model://birds"}
    trial_run = TrainingRunBuilder("t").with_("spec.inputs", [base])
    body = SweepBuilder("s").trial(trial_run).trials(3, 1).seed(7).obj()
    said: list[str] = []
    LocalSweep(
        api.parse_sweep(body),
        body["spec"]["parameters"],
        make_run,  # type: ignore[arg-type]
        parallel=1,
        store=store,
        environment=None,
        say=said.append,
    ).execute()
    assert [[(i.uri, i.revision) for i in r.spec.inputs] for r in made] == [
        [("model://birds", "1")]
    ] * 3
    assert store.versions("default", "birds") == [1, 2, 3, 4]
    assert "input base: every trial starts from version 1" in said

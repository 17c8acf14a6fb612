"""Local mode restarts a failed rank in place, as a cluster does: the run's node launchers
(processes here) stay, their ranks start again, and the run ends as the one that did not
fail; without backoffLimit the first failure ends the run."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from torchyard import api, local

# Rank 2 fails once (the first time no marker exists); each rank says which launcher (its
# parent process) started it, when it fails and when it ends.
TRAIN = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    marker = os.environ["FAILED_ONCE"]
    if rank == 2 and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getppid()))
        sys.exit(3)
    time.sleep(0.5)
    with open(os.path.join(os.environ["TORCHYARD_OUTPUTS"], f"done-{rank}"), "w") as f:
        f.write(str(os.getppid()))
    """
)


def run_twice_two(tmp_path: Path, backoff_limit: int) -> tuple[local.LocalResult, str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(TRAIN)
    body = (
        TrainingRunBuilder("bend")
        .nodes(2)
        .procs(2)
        .command("python", "train.py")
        .with_("spec.policy", {"backoffLimit": backoff_limit})
        .obj()
    )
    out = io.StringIO()
    result = local.run_local(
        api.parse_trainingrun(body),
        src,
        ["train.py"],
        registry=tmp_path / "registry",
        workroot=tmp_path / "runs",
        out=out,
    )
    return result, out.getvalue()


def test_a_failed_rank_is_restarted_in_place_by_the_same_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "failed-once"
    monkeypatch.setenv("FAILED_ONCE", str(marker))
    result, said = run_twice_two(tmp_path, backoff_limit=2)
    assert result.exit_code == 0, said
    assert result.in_place is not None and result.in_place["inPlace"] == 1, said
    assert result.in_place["failure"]["rank"] == 2
    assert "the ranks were restarted in place 1 time(s); the last: rank 2 (node 1) failed" in said
    node_1 = result.workdir / "node-1" / "outputs"
    # the launcher that saw rank 2 fail is the one that started it again
    assert (node_1 / "done-2").read_text() == marker.read_text()


def test_without_backoff_limit_a_local_run_fails_with_its_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAILED_ONCE", str(tmp_path / "failed-once"))
    result, said = run_twice_two(tmp_path, backoff_limit=0)
    assert result.exit_code == 3, said
    assert result.in_place is None
    assert result.failure is not None and result.failure["rank"] == 2
    assert "restarted in place" not in said

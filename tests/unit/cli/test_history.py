"""Run history in local mode, end to end: ``torchyard run --local`` writes each run's
record into the local registry (spec, failure, log tails, metric reports), a name used
again keeps both records, and ``torchyard runs list --local`` / ``runs describe --local``
read them (the cluster's side is tests/integration/test_run_records.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.builders import TrainingRunBuilder
from torchyard import cli
from torchyard.records import FolderRecords

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from torchyard import progress
    rank = int(os.environ["RANK"])
    for step in range(1, 4):
        progress.report(step, total=3, loss=1.0 / step)
    done = Path(os.environ["REPORTED"])  # rank 0 has reported: the failure stops no report
    if rank == 0:
        done.touch()
    while not done.exists():
        time.sleep(0.05)
    if os.environ.get("FAIL") and rank == 1:
        print("about to fail <script>alert(1)</script>", flush=True)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    """
)


def local_run(tmp_path: Path, fail: bool) -> int:
    body = TrainingRunBuilder("birds").nodes(2).procs(1).obj()
    reported = tmp_path / f"reported-{fail}"
    body["spec"]["env"] = [{"name": "REPORTED", "value": str(reported)}]
    if fail:
        body["spec"]["env"].append({"name": "FAIL", "value": "1"})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(body))
    argv = ["run", "run.yaml", "--local", "--source", ".", "--workdir", "./runs"]
    return cli.main([*argv, "--registry", "./registry"])


def test_local_runs_are_recorded_and_listed_and_described(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    assert local_run(tmp_path, fail=False) == 0
    assert local_run(tmp_path, fail=True) != 0
    capsys.readouterr()

    page = FolderRecords(tmp_path / "registry").list_records("default")
    assert [s["phase"] for s in page.items] == ["Failed", "Succeeded"]  # newest first
    failed = FolderRecords(tmp_path / "registry").get_record("default", "birds")
    assert failed is not None and failed["uid"] == page.items[0]["uid"]
    assert failed["failure"] is not None and failed["failure"]["rank"] == 1
    assert failed["failureClass"] == "CudaOOM"
    assert any("about to fail" in line for line in failed["logTails"]["1"])
    assert failed["spec"]["distribution"]["nodeCount"] == 2
    metrics = FolderRecords(tmp_path / "registry").metrics_lines("default", "birds", failed["uid"])
    steps = sorted((json.loads(x)["rank"], json.loads(x)["step"]) for x in metrics)
    assert steps == [(rank, step) for rank in (0, 1) for step in (1, 2, 3)]

    assert cli.main(["runs", "list", "--local", "--registry", "./registry"]) == 0
    out = capsys.readouterr().out
    assert out.count("birds") == 2 and "CudaOOM" in out and "Succeeded" in out
    assert (
        cli.main(["runs", "list", "--local", "--registry", "./registry", "--phase", "Succeeded"])
        == 0
    )
    out = capsys.readouterr().out
    assert "Succeeded" in out and "Failed" not in out

    assert cli.main(["runs", "describe", "birds", "--local", "--registry", "./registry"]) == 0
    out = capsys.readouterr().out
    assert "Phase:        Failed" in out
    assert "rank 1" in out and "CUDA out of memory" in out
    assert "class: CudaOOM" in out and "advice:" in out
    assert "Log tail of node 1:" in out and "about to fail" in out
    older = page.items[1]["uid"]
    argv = ["runs", "describe", "birds", "--local", "--registry", "./registry", "--uid", older]
    assert cli.main([*argv, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["phase"] == "Succeeded"


def test_asking_for_what_is_not_there_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["runs", "describe", "nothing", "--local", "--registry", "./registry"]
    assert cli.main(argv) == 1
    assert "no record of it" in capsys.readouterr().err
    argv = ["runs", "list", "--local", "--registry", "./registry", "--limit", "100000"]
    assert cli.main(argv) == 2
    assert "limit: 100000 is not between 1 and 500" in capsys.readouterr().err
    argv = ["runs", "describe", "../../etc", "--local", "--registry", "./registry"]
    assert cli.main(argv) == 2
    assert "is not a DNS-1123 subdomain" in capsys.readouterr().err
    assert cli.main(["runs", "list", "-n", "default", "--registry", "./registry"]) == 2
    assert "--registry goes with --local" in capsys.readouterr().err


def test_a_local_run_whose_yaml_names_no_namespace_is_recorded_in_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As its archive is: a TrainingRun YAML as users write it, with no metadata.namespace."""
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    body = TrainingRunBuilder("birds").nodes(1).procs(1).obj()
    body["metadata"].pop("namespace", None)
    body["spec"]["env"] = [{"name": "REPORTED", "value": str(tmp_path / "reported")}]
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(body))
    argv = ["run", "run.yaml", "--local", "--source", ".", "--workdir", "./runs"]
    assert cli.main([*argv, "--registry", "./registry"]) == 0
    assert "record was not written" not in capsys.readouterr().out
    [summary] = FolderRecords(tmp_path / "registry").list_records("default").items
    assert (summary["namespace"], summary["name"], summary["phase"]) == (
        "default",
        "birds",
        "Succeeded",
    )

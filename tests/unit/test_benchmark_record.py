"""benchmarks/record.py: the results file every benchmark writes (the machine, the load at
its start and end, versions, every round and the summary figures), where it goes (a
``--smoke`` run writes none unless ``--results`` names a file), and its command-line form
for shell benchmarks (benchmarks/gpu/check.sh). docs/gen/benchmark_page.py renders these
files, so the test also renders one."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from benchmarks import record


def _args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"smoke": False, "results": None, **values})


def test_a_run_writes_its_figures_rounds_machine_load_and_versions(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    rec = record.Record("bench", _args(results=str(out), repeats=3, where=tmp_path))
    rec.round(round=1, seconds=1.23456789, arm="torchyard")
    rec.figure(
        "time to first step",
        1.5,
        "s",
        spread=(1.2, 1.9),
        baseline=("torchrun", 2.0),
        ratio=0.75,
        target="<= 1.10",
        met=True,
    )
    rec.figure("never reached", math.inf, "s")
    rec.version("kubernetes", "v1.37.2")
    assert rec.write() == out
    data = json.loads(out.read_text())
    assert data["benchmark"] == "bench" and data["schema"] == record.SCHEMA
    assert data["command"].startswith("python benchmarks/")
    assert data["settings"] == {"smoke": False, "repeats": 3, "where": str(tmp_path)}
    assert data["rounds"] == [{"round": 1, "seconds": 1.23457, "arm": "torchyard"}]
    first = data["figures"][0]
    assert first["baseline"] == {"name": "torchrun", "value": 2.0}
    assert first["spread"] == [1.2, 1.9] and first["met"] is True
    assert data["figures"][1]["value"] == "inf"  # JSON has no infinity
    assert data["machine"]["cpus"] >= 1 and data["machine"]["arch"]
    assert len(data["load_average"]["start"]) == 3 and len(data["load_average"]["end"]) == 3
    assert data["versions"]["python"] and data["versions"]["kubernetes"] == "v1.37.2"
    assert data["started"] <= data["finished"]


@pytest.mark.parametrize(
    ("smoke", "results", "written"),
    [(True, None, False), (True, "x.json", True), (False, "-", False), (False, None, True)],
)
def test_where_the_file_goes(smoke: bool, results: str | None, written: bool) -> None:
    target = record.Record("bench", _args(smoke=smoke, results=results)).target()
    assert (target is not None) == written
    if written and results is None:
        assert target == record.RESULTS / "bench.json"


def test_a_shell_benchmark_writes_through_the_command_line(tmp_path: Path) -> None:
    figures = tmp_path / "figures.tsv"
    figures.write_text("birds: wall time (exit 0)\t12.5\ts\ncuda-oom: classified\t3/3\t\tall\t1\n")
    out = tmp_path / "gpu.json"
    code = record.main(
        [
            "gpu_check",
            str(figures),
            "--command",
            "bash benchmarks/gpu/check.sh",
            "--load-start",
            "1,2,3",
            "--note",
            "torch 2.15",
            "--results",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["command"] == "bash benchmarks/gpu/check.sh"
    assert data["load_average"]["start"] == [1.0, 2.0, 3.0]
    assert data["figures"] == [
        {"name": "birds: wall time (exit 0)", "value": 12.5, "unit": "s"},
        {"name": "cuda-oom: classified", "value": "3/3", "unit": "", "target": "all", "met": True},
    ]
    assert data["notes"] == ["torch 2.15"]


def test_the_benchmarks_page_shows_a_results_file(tmp_path: Path) -> None:
    from docs.gen import benchmark_page

    rec = record.Record("bench", _args(results=str(tmp_path / "b.json")))
    rec.round(round=1, seconds=2.0)
    rec.figure("fan-out", 5.25, "s", baseline=("direct", 4.0), ratio=1.3125, target="<= 1.3")
    rec.figure("missed", 2, "runs", target="<= 1", met=False)
    text = benchmark_page.section("bench", None, rec.data())
    assert "| fan-out | 5.25 s |  | direct: 4.00 s | 1.31 | &lt;= 1.3 |" in text
    assert "(**missed**)" in text
    assert "**Where**" in text and "**Load average**" in text and "**Command**" in text
    # every benchmark that writes a results file is on the page, with or without one
    assert {"launch_overhead", "fanout", "scale", "why", "gpu_check"} <= set(
        benchmark_page.scripts()
    )


def test_torchyard_run_from_its_source_tree_still_names_its_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torchyard

    def not_installed(package: str) -> str:
        raise record.importlib.metadata.PackageNotFoundError(package)

    monkeypatch.setattr(record.importlib.metadata, "version", not_installed)
    assert record.versions()["torchyard"] == torchyard.__version__

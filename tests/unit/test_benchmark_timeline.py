"""benchmarks/timeline.py: the steps of a fan-out read from what the watches saw."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks import timeline

LABELS = ("torchyard.dev/run", "jobset.sigs.k8s.io/jobset-name")


def pod(name: str, run: str, phase: str = "Pending", label: str = LABELS[0]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {label: run}}, "status": {"phase": phase}}


def obj(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, **({"status": status} if status else {})}


def test_a_torchyard_runs_steps_from_its_objects_and_pods() -> None:
    seen = timeline.Seen()
    seen.note("trainingruns", obj("tr-2-0"), 10.05, LABELS)
    seen.note("services", obj("tr-2-0"), 10.30, LABELS)
    seen.note("pods", pod("tr-2-0-node-0", "tr-2-0"), 10.40, LABELS)
    seen.note("pods", pod("tr-2-0-node-1", "tr-2-0"), 10.60, LABELS)
    seen.note("trainingruns", obj("tr-2-0", {"phase": "Pending"}), 10.70, LABELS)
    seen.note("pods", pod("tr-2-0-node-1", "tr-2-0", "Running"), 11.00, LABELS)
    seen.note("pods", pod("tr-2-0-node-0", "tr-2-0", "Running"), 11.50, LABELS)
    seen.note("pods", pod("tr-2-0-node-0", "tr-2-0", "Running"), 12.00, LABELS)  # again
    got = timeline.milestones(seen, "tr-2-0", "trainingruns", 2, 10.0)
    assert got == pytest.approx(
        {
            "seen": 0.05,
            "child": 0.30,  # the Service, before any Pod
            "service": 0.30,
            "status": 0.70,
            "first_pod": 0.40,
            "last_pod": 0.60,
            "running": 1.50,  # the second Pod's first Running event
        }
    )


def test_a_child_of_another_kind_and_other_runs_pods_are_told_apart() -> None:
    seen = timeline.Seen()
    seen.note("trainjobs", obj("tj-1-0"), 5.1, LABELS)
    seen.note("jobsets", obj("tj-1-0"), 5.2, LABELS)  # the TrainJob's child: same name
    seen.note("jobs", obj("tj-1-0-node-0"), 5.3, LABELS)
    seen.note("pods", pod("tj-1-0-node-0-0", "tj-1-0", label=LABELS[1]), 5.5, LABELS)
    seen.note("pods", pod("tj-10-0-node-0-0", "tj-10-0", "Running", LABELS[1]), 5.0, LABELS)
    got = timeline.milestones(seen, "tj-1-0", "trainjobs", 1, 5.0)
    assert got["child"] is not None and abs(got["child"] - 0.2) < 1e-9
    assert got["service"] is None  # none was made
    assert got["first_pod"] is not None and abs(got["first_pod"] - 0.5) < 1e-9
    assert got["running"] is None  # its Pod never ran; the other run's does not count
    assert got["status"] is None  # the JobSet's status is not the TrainJob's


def test_objects_of_an_earlier_run_of_the_same_name_are_not_counted() -> None:
    seen = timeline.Seen()
    seen.note("services", obj("direct-8-0"), 1.0, LABELS)
    got = timeline.milestones(seen, "direct-8-0", None, 8, 2.0)
    assert got == dict.fromkeys(got)  # nothing seen after the create


def test_the_report_prints_every_step_and_the_three_parts() -> None:
    lines: list[str] = []
    rows = {
        ("torchyard", 8): [
            {"seen": 0.1, "child": 0.2, "service": 0.2, "status": 0.9, "first_pod": 0.3,
             "last_pod": 0.5, "running": 1.0},
            {"seen": 0.1, "child": 0.4, "service": 0.4, "status": 1.1, "first_pod": 0.5,
             "last_pod": 0.9, "running": 1.4},
        ],
        ("direct", 8): [
            {"seen": None, "child": 0.01, "service": None, "status": None, "first_pod": 0.01,
             "last_pod": 0.2, "running": 0.6},
        ],
    }  # fmt: skip
    timeline.report(rows, ["direct", "torchyard"], [8], lines.append)
    text = "\n".join(lines)
    assert "before the first Pod" in text
    torchyard = [line for line in lines if line.startswith("   8  torchyard")]
    # medians: first Pod at 0.40 s; creating the Pods 0.30 s; then 0.50 s to all Running;
    # then each part's rounds, in order
    assert torchyard[1].split()[2:5] == ["0.40s", "0.30s", "0.50s"]
    assert torchyard[1].endswith("(0.30 0.50 | 0.20 0.40 | 0.50 0.50)")
    direct = [line for line in lines if line.startswith("   8  direct")]
    assert direct[0].split()[2] == "-"  # no run object


def gated(name: str, run: str, node: str = "", phase: str = "Pending") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    if not node:
        spec["schedulingGates"] = [{"name": "torchyard.dev/gang"}]
    return {**pod(name, run, phase), "spec": spec}


def test_each_pod_s_steps_are_timed_from_the_one_before() -> None:
    seen = timeline.Seen()
    seen.note("pods", pod("direct-2-0-node-9", "direct-2-0"), 1.0, LABELS)  # an earlier run
    seen.note("pods", gated("tr-2-0-node-0", "tr-2-0"), 10.0, LABELS)
    ungated = {**pod("tr-2-0-node-0", "tr-2-0"), "spec": {}}
    seen.note("pods", ungated, 10.5, LABELS)
    seen.note("pods", gated("tr-2-0-node-0", "tr-2-0", "kwok-0"), 10.75, LABELS)
    seen.note("pods", gated("tr-2-0-node-0", "tr-2-0", "kwok-0", "Running"), 11.75, LABELS)
    # a Pod created without gates is ungated at once, and one not bound yet has no later step
    seen.note("pods", {**pod("tr-2-0-node-1", "tr-2-0"), "spec": {}}, 10.25, LABELS)
    got = timeline.pod_stages(seen, "tr-2-0", 2.0)
    assert got == {
        "gated": [0.5, 0.0],
        "scheduling": [0.25],
        "starting": [1.0],
        "total": [1.75],
    }


@pytest.mark.parametrize(
    ("q", "want"), [(0.5, 5.0), (0.95, 10.0), (0.9, 9.0), (0.0, 1.0), (1.0, 10.0)]
)
def test_a_percentile_is_the_nearest_rank(q: float, want: float) -> None:
    assert timeline.percentile([float(x) for x in range(10, 0, -1)], q) == want


def test_the_per_pod_report_prints_median_and_95th_percentile_of_every_step() -> None:
    lines: list[str] = []
    stages = {"gated": [0.1] * 19 + [2.0], "scheduling": [], "starting": [1.0], "total": [3.0]}
    timeline.report_pods({("torchyard", 8): stages}, ["direct", "torchyard"], [8], lines.append)
    row = [line for line in lines if line.startswith("   8  torchyard")]
    assert row[0].split()[2:] == ["0.10", "/", "0.10s", "-", "1.00", "/", "1.00s", "3.00", "/",
                                  "3.00s"]  # fmt: skip
    assert not [line for line in lines if line.startswith("   8  direct")]  # not measured


def test_the_timeline_says_whether_its_watches_saw_the_run_s_pods_running() -> None:
    line = timeline.Timeline({}, LABELS)
    line.seen.note("pods", pod("tr-2-0-node-0", "tr-2-0", "Running"), 3.0, LABELS)
    assert line.caught_up("tr-2-0", 1, 2.0)
    assert not line.caught_up("tr-2-0", 2, 2.0, timeout=0)  # one of two seen Running
    assert not line.caught_up("tr-2-0", 1, 4.0, timeout=0)  # created before this create

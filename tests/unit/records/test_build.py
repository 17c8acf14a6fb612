"""Records as pure functions of the objects: what each kind keeps, and the bounds that keep
a record small whatever the run printed."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tests.builders import pod
from torchyard import records
from torchyard.records import build
from torchyard.records.schema import summary_of

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
UID = "0d000000-0000-4000-8000-000000000001"


def body(kind: str = "TrainingRun", **status: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {
            "name": "birds",
            "namespace": "team-a",
            "uid": UID,
            "creationTimestamp": "2026-03-01T10:00:00Z",
            "labels": {"torchyard.dev/experiment": "exp", "torchyard.dev/sweep": "sw"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
        },
        "spec": {"command": ["python", "train.py"]},
        "status": status,
    }


def event(reason: str, message: str, at: str) -> dict[str, Any]:
    return {"type": "Normal", "reason": reason, "message": message, "lastTimestamp": at}


def test_a_run_keeps_its_spec_status_labels_and_model() -> None:
    run = body(
        phase="Succeeded", completionTime="2026-03-01T11:00:00Z", model={"name": "m", "version": 3}
    )
    record = records.trainingrun_record(run, [], [], {}, NOW)
    assert (record["kind"], record["name"], record["uid"], record["phase"]) == (
        "TrainingRun",
        "birds",
        UID,
        "Succeeded",
    )
    assert (record["experiment"], record["sweep"]) == ("exp", "sw")
    assert (
        record["finished"] == "2026-03-01T11:00:00Z"
        and record["recorded"] == "2026-03-01T12:00:00.000000Z"
    )
    assert record["model"] == {"name": "m", "version": 3} and record["failure"] is None
    assert record["annotations"] == {}  # kubectl's copy of the spec is left out
    assert record["deleted"] is False
    summary = summary_of(record)
    assert "spec" not in summary and "logTails" not in summary and summary["uid"] == UID


def test_attempts_come_from_the_restarting_events_and_expired_ones_are_listed_without_times() -> (
    None
):
    run = body(
        phase="Failed",
        restarts=3,
        startTime="2026-03-01T10:01:00Z",
        completionTime="2026-03-01T10:40:00Z",
    )
    said = [
        event("Restarting", "node 1 lost", "2026-03-01T10:20:00Z"),
        event("Started", "x", "2026-03-01T10:21:00Z"),
    ]
    attempts = records.trainingrun_record(run, [], said, {}, NOW)["attempts"]
    assert [(a["attempt"], a["outcome"], a.get("started"), a.get("ended")) for a in attempts] == [
        (0, "Restarted", "2026-03-01T10:01:00Z", None),
        (1, "Restarted", None, None),
        (2, "Restarted", None, "2026-03-01T10:20:00Z"),
        (3, "Failed", "2026-03-01T10:20:00Z", "2026-03-01T10:40:00Z"),
    ]


def test_a_run_deleted_while_running_ends_when_it_was_deleted() -> None:
    record = records.trainingrun_record(body(phase="Running"), [], [], {}, NOW, deleted=True)
    assert record["deleted"] is True and record["phase"] == "Running"
    assert record["finished"] == "2026-03-01T12:00:00Z"
    assert record["attempts"][-1]["outcome"] == "Deleted"


def test_nodes_say_where_and_how_long_each_pod_ran() -> None:
    done = pod("birds", 1, phase="Failed", node_name="gpu-1", exit_code=137, reason="OOMKilled")
    done["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"] = (
        "2026-03-01T10:02:00Z"
    )
    up = pod("birds", 0, phase="Running", node_name="gpu-0")
    nodes = build.node_timings([done, up])
    assert [(n["node"], n["nodeName"], n["phase"], n["exitCode"], n["reason"]) for n in nodes] == [
        (0, "gpu-0", "Running", None, None),
        (1, "gpu-1", "Failed", 137, "OOMKilled"),
    ]
    assert nodes[1]["started"] == "2026-03-01T10:02:00Z"


def test_tails_events_and_messages_are_bounded_and_the_failing_node_is_kept() -> None:
    tails = {n: [f"line {i} " + "x" * 5000 for i in range(500)] for n in range(40)}
    kept = build.log_tails(tails, failing=33)
    assert len(kept) == build.MAX_TAIL_NODES and "33" in kept and "15" not in kept
    assert all(len(lines) == build.TAIL_LINES for lines in kept.values())
    assert kept["0"][-1].startswith("line 499 ") and len(kept["0"][-1]) <= build.MAX_MESSAGE + 3
    many = [
        event("Tick", "m" * 10_000, f"2026-03-01T10:{i // 60:02d}:{i % 60:02d}Z")
        for i in range(300)
    ]
    kept_events = build.events(many)
    assert len(kept_events) == build.MAX_EVENTS
    assert kept_events[-1]["time"] == many[-1]["lastTimestamp"]
    assert max(len(e["message"]) for e in kept_events) <= build.MAX_MESSAGE + 3


def test_a_sweep_and_an_environment_build_have_records_of_their_own() -> None:
    sweep = records.sweep_record(
        body("Sweep", phase="Succeeded", bestTrial={"name": "t-3"}), [], NOW
    )
    assert sweep["kind"] == "Sweep" and sweep["status"]["bestTrial"] == {"name": "t-3"}
    env = records.environment_record(
        body("Environment", phase="Failed", message="pip failed"),
        [],
        ["Collecting torch", "ERROR: no"],
        NOW,
    )
    assert env["kind"] == "Environment" and env["logTails"] == {
        "0": ["Collecting torch", "ERROR: no"]
    }
    assert env["finished"] == "2026-03-01T12:00:00Z"

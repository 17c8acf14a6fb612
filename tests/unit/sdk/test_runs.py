"""What `torchyard wait`/`describe` print about a run: node states, the failing rank."""

from __future__ import annotations

from datetime import datetime, timezone

from torchyard.sdk import runs


def pod(phase: str, **extra: object) -> dict[str, object]:
    return {"metadata": {"name": "p"}, "spec": dict(extra), "status": {"phase": phase}}


def test_node_states_name_gates_and_exit_codes() -> None:
    assert runs.pod_state(pod("Pending", schedulingGates=[{"name": "g"}])) == "Gated"
    assert runs.pod_state(pod("Running")) == "Running"
    failed = pod("Failed")
    failed["status"] = {  # type: ignore[index]
        "phase": "Failed",
        "containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}],
    }
    assert runs.pod_state(failed) == "Failed (exit 3)"


def test_the_failure_names_rank_node_pod_and_traceback() -> None:
    run = {
        "metadata": {"name": "gpt", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "phase": "Failed",
            "completionTime": "2026-01-01T00:01:05Z",
            "failure": {
                "rank": 3,
                "node": 1,
                "pod": "gpt-1",
                "exitCode": 1,
                "reason": "Error",
                "message": "Traceback (most recent call last):\nValueError: loss is NaN",
            },
        },
    }
    code, text = runs.outcome(run)
    assert code == 1
    assert text == (
        "TrainingRun gpt failed after 1m05s: "
        "rank 3 (node 1, Pod gpt-1) failed (Error, exit code 1):\n"
        "Traceback (most recent call last):\nValueError: loss is NaN"
    )


def test_the_summary_line_shows_elapsed_phase_and_every_node() -> None:
    run = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Running"},
    }
    now = datetime(2026, 1, 1, 0, 2, 30, tzinfo=timezone.utc)
    assert runs.duration(runs.elapsed(run, now)) == "2m30s"
    line = runs.summary_line(run, [pod("Running"), pod("Pending")])
    assert line.endswith("] Running  (node 0: Running, node 1: Pending)")

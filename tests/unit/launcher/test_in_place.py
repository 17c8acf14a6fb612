"""In-place restarts, with real launchers: two node launchers of two ranks each, run as
real processes from a shipped package folder (as in node Pods) and sharing a checkpoint
folder, agree through node 0's coordinator to restart their ranks when one is killed,
without ending themselves; the run's final state is the uninterrupted one's. And what
ends the restarts: backoffLimit, a class that is not retryable, the same error twice."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.shipped import launcher, lay_out
from torchyard import checkpoint
from torchyard.launch import coordination

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
STEPS = 200
# Each rank's state after step n is a function of the one after step n-1 only: a run
# resumed from its checkpoints must end with the uninterrupted one's states.
TRAIN = """
import json, os, sys, time
from torchyard import checkpoint, progress

rank = int(os.environ["RANK"])
steps = int(os.environ["STEPS"])
with open(os.path.join(os.environ["PIDS"], f"rank-{rank}"), "w") as f:
    f.write(str(os.getpid()))
if os.environ.get("FAIL") == "import":
    import no_such_module_for_torchyard  # noqa
resume = os.environ.get("TORCHYARD_RESUME_FROM")
saved = {"state": float(rank), "step": 0}
if resume:  # every restart in place starts here again, from the newest checkpoint
    saved = json.loads(open(os.path.join(resume, f"state-{rank}.json")).read())
state, start = saved["state"], saved["step"]
for step in range(start + 1, steps + 1):
    state = state * 0.5 + step
    if os.environ.get("FAIL") == "raise" and rank == 2 and step == 5:
        raise RuntimeError("the same error at step 5")
    if checkpoint.should_save(step):
        folder = checkpoint.save_dir(step)
        with open(os.path.join(folder, f"state-{rank}.json"), "w") as f:
            json.dump({"step": step, "state": state}, f)
        checkpoint.done(step)
    progress.report(step, total=steps)
    time.sleep(0.05)
with open(os.path.join(os.environ["TORCHYARD_OUTPUTS"], f"final-{rank}.json"), "w") as f:
    json.dump({"state": state}, f)
"""


def reference(rank: int) -> float:
    state = float(rank)
    for step in range(1, STEPS + 1):
        state = state * 0.5 + step
    return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nodes(tmp_path: Path, backoff_limit: int, fail: str = "") -> list[subprocess.Popen[str]]:
    package = lay_out(tmp_path / "lib")
    port = free_port()
    budget = coordination.Budget(backoff_limit, 0).to_json()
    (tmp_path / "pids").mkdir()
    nodes = []
    for node in range(NODES):
        work = tmp_path / f"node-{node}"
        work.mkdir()
        (work / "train.py").write_text(TRAIN)
        env = {
            "PATH": os.environ["PATH"],
            "STEPS": str(STEPS),
            "PIDS": str(tmp_path / "pids"),
            "FAIL": fail,
            "NODE_RANK": str(node),
            "WORLD_SIZE": str(WORLD),
            "TORCHYARD_NNODES": str(NODES),
            "TORCHYARD_NPROC_PER_NODE": str(PER_NODE),
            "TORCHYARD_TERMINATION_LOG": str(work / "termination.json"),
            "TORCHYARD_GRACE_PERIOD": "5",
            "TORCHYARD_SHIPPED_PATH": str(tmp_path / "lib"),
            "TORCHYARD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "TORCHYARD_CHECKPOINT_ATTEMPT": "run-0",
            "TORCHYARD_CHECKPOINT_INTERVAL": "4",
            "TORCHYARD_COORDINATOR": f"127.0.0.1:{port}",
            "TORCHYARD_RESTART_BUDGET": budget,
        }
        argv = [sys.executable, "-I", str(launcher(package)), "--", sys.executable, "train.py"]
        nodes.append(
            subprocess.Popen(
                argv, cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    return nodes


def rank_pid(tmp_path: Path, rank: int, other_than: int | None = None) -> int:
    """The pid of ``rank``'s process, once it started (and is not ``other_than``)."""
    path = tmp_path / "pids" / f"rank-{rank}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text and int(text) != other_than:
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not start (again)")


def saved_steps(tmp_path: Path) -> list[int]:
    folder = tmp_path / "checkpoints"
    return checkpoint.complete_steps(str(folder), verify=False) if folder.exists() else []


def wait_for_checkpoint_after(tmp_path: Path, step: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        newer = [s for s in saved_steps(tmp_path) if s > step]
        if newer:
            return newer[-1]
        time.sleep(0.05)
    raise AssertionError(f"no complete checkpoint after step {step}")


def newest(tmp_path: Path) -> int:
    steps = saved_steps(tmp_path)
    return steps[-1] if steps else 0


def kill_after_progress(tmp_path: Path, pid: int) -> int:
    """SIGKILL rank 2 (``pid``) once the ranks completed a checkpoint after the newest one
    there was (so that this generation made progress: a rank that dies at the step it
    resumed from, twice, is "the same error at the same step"); its next pid."""
    wait_for_checkpoint_after(tmp_path, newest(tmp_path))
    os.kill(pid, signal.SIGKILL)
    return rank_pid(tmp_path, 2, other_than=pid)


def ended(nodes: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    out = []
    for proc in nodes:
        _, err = proc.communicate(timeout=120)
        out.append((proc.returncode, err))
    return out


def termination(tmp_path: Path, node: int) -> dict[str, Any]:
    said: dict[str, Any] = json.loads((tmp_path / f"node-{node}" / "termination.json").read_text())
    return said


def test_a_killed_rank_restarts_every_rank_in_place_and_the_run_ends_as_if_uninterrupted(
    tmp_path: Path,
) -> None:
    nodes = start_nodes(tmp_path, backoff_limit=5)
    launchers = [p.pid for p in nodes]
    pid = rank_pid(tmp_path, 2)
    for _ in range(3):
        pid = kill_after_progress(tmp_path, pid)
    results = ended(nodes)
    assert [code for code, _ in results] == [0, 0], results
    assert [p.pid for p in nodes] == launchers  # the same launchers throughout
    for node in range(NODES):
        for local in range(PER_NODE):
            rank = node * PER_NODE + local
            final = json.loads(
                (tmp_path / f"node-{node}" / "outputs" / f"final-{rank}.json").read_text()
            )
            assert final["state"] == reference(rank), (rank, final)
    for node in range(NODES):
        said = termination(tmp_path, node)
        assert said["reason"] == "Completed", said
        in_place = said["inPlace"]
        assert (in_place["inPlace"], in_place["failedAttempts"]) == (3, 3), in_place
        assert in_place["failure"] == {
            "rank": 2,
            "nodeRank": 1,
            "exitCode": 137,
            "signal": 9,
            "reason": "Error",
            "step": in_place["failure"]["step"],
            "lastLine": "",  # a SIGKILL leaves no traceback
        }
        assert in_place["message"].startswith("rank 2 (node 1) failed (signal 9"), in_place
    node_0_log = results[0][1]
    assert node_0_log.count("restarted-in-place {") == 3, node_0_log
    assert "resuming from checkpoint" in results[1][1]


def test_backoff_limit_ends_the_restarts_and_the_failing_node_reports_its_failure(
    tmp_path: Path,
) -> None:
    nodes = start_nodes(tmp_path, backoff_limit=1)
    pid = kill_after_progress(tmp_path, rank_pid(tmp_path, 2))
    wait_for_checkpoint_after(tmp_path, newest(tmp_path))
    os.kill(pid, signal.SIGKILL)
    results = ended(nodes)
    # node 1 ends with the failure (the operator decides from its Pod); node 0's ranks
    # went on to the end, as without coordination
    assert results[1][0] == 137, results[1]
    said = termination(tmp_path, 1)
    assert (said["rank"], said["signal"], said["reason"]) == (2, 9, "Error"), said
    assert said["inPlace"]["failedAttempts"] == 1, said
    # (the coordinator, on node 0, says it; so does node 1 when it hears it before node 0
    # ends and takes the coordinator along)
    assert "not restarted in place: backoffLimit 1 used" in results[0][1]
    assert results[0][0] == 0, results[0]


@pytest.mark.parametrize(
    ("fail", "restarts", "why"),
    [
        ("import", 0, "ImportError is not retryable"),
        ("raise", 1, "the same error at the same step as the restart before"),
    ],
)
def test_what_a_retry_cannot_mend_is_not_restarted_in_place(
    tmp_path: Path, fail: str, restarts: int, why: str
) -> None:
    nodes = start_nodes(tmp_path, backoff_limit=3, fail=fail)
    results = ended(nodes)
    assert results[1][0] != 0, results[1]
    # (said by the node whose failure the coordinator decided on: with every rank failing
    # at import, the one that reported first; node 0's exit then takes the coordinator)
    said_by = results[0][1] + results[1][1]
    assert f"not restarted in place: {why}" in said_by, said_by
    said = termination(tmp_path, 1)
    assert said.get("inPlace", {}).get("inPlace", 0) == restarts, said


KILLED = {"rank": 2, "nodeRank": 1, "exitCode": 137, "signal": 9, "reason": "Error", "step": 40}
RAISED = {
    "rank": 1,
    "nodeRank": 0,
    "exitCode": 1,
    "reason": "Error",
    "step": 7,
    "message": "Traceback (most recent call last):\nRuntimeError: boom",
}


@pytest.mark.parametrize(
    ("failure", "budget", "why"),
    [
        (KILLED, coordination.Budget(3, 0), None),
        (KILLED, coordination.Budget(3, 2, 2), None),
        (KILLED, coordination.Budget(3, 3, 1), "backoffLimit 3 used"),
        (KILLED, coordination.Budget(0, 0), "backoffLimit 0 used"),
        (
            RAISED,
            coordination.Budget(3, 1, 1, "PythonException|7|RuntimeError: boom"),
            "the same error at the same step as the restart before",
        ),
        (RAISED, coordination.Budget(3, 1, 1, "PythonException|6|RuntimeError: boom"), None),
        (
            {**RAISED, "message": "ModuleNotFoundError: No module named 'x'"},
            coordination.Budget(3, 0),
            "ImportError is not retryable",
        ),
        (
            {**KILLED, "reason": "NoProgress", "message": "3 attempts failed"},
            coordination.Budget(3, 0),
            "NoProgress: 3 attempts failed",
        ),
        (
            {**RAISED, "logRule": {"index": 0, "action": "excludeNode"}},
            coordination.Budget(3, 0),
            "policy.logRules[0] says excludeNode",
        ),
        (
            {
                **KILLED,
                "evidence": [
                    {"line": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"}
                ],
            },
            coordination.Budget(3, 0),
            "GpuXid is the node's fault: the operator decides",
        ),
    ],
)
def test_the_coordinator_restarts_in_place_what_the_operator_would_restart(
    failure: dict[str, Any], budget: coordination.Budget, why: str | None
) -> None:
    chosen = coordination.first([failure])
    assert chosen is not None
    assert coordination.decide(chosen, budget) == why


def test_of_one_generation_s_failures_the_first_that_is_not_a_cascade_is_decided_on() -> None:
    timeout = {
        **RAISED,
        "rank": 3,
        "exitedAt": 10.0,
        "message": (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Timed out waiting 15000ms for recv operation to complete"
        ),
    }
    killed = {**KILLED, "exitedAt": 12.0}
    later = {**RAISED, "exitedAt": 13.0}
    chosen = coordination.first([later, timeout, killed])
    assert chosen is not None and chosen["rank"] == 2, chosen
    assert coordination.first([]) is None


def test_hostile_peers_cannot_crash_or_steer_the_coordinator() -> None:
    said: list[str] = []
    port = free_port()
    coordinator = coordination.Coordinator(
        port, 2, coordination.Budget(3, 0), 1, said.append, settle=0.1
    )
    try:
        for payload in (
            b"not json\n",
            b"[1, 2]\n",
            b'{"hello": 7}\n{"failed": {"rank": 0}, "generation": 0}\n',  # no such node
            b'{"hello": true}\n{"done": true, "generation": 0}\n',
            b'{"failed": {"rank": 0}, "generation": 0}\n',  # before saying who it is
            b"x" * (coordination.LINE_LIMIT + 10) + b"\n",
        ):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(payload)
        time.sleep(0.5)
        assert coordinator.restarts == [] and said == []
        # a real node is still heard: the coordinator did not stop serving
        peer = coordination.Peer(f"127.0.0.1:{port}", 1, 5)
        peer.send(failed=KILLED)
        restart = peer.wait("restart")
        assert restart is not None and restart["restart"] == 1, restart
        assert coordinator.restarts[0]["failure"]["rank"] == 2
        peer.close()
    finally:
        coordinator.close()


def test_a_launcher_waiting_at_the_barrier_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """Node 1's rank fails, the coordinator (here, for a run of 2 whose node 0 never comes)
    asks for a restart, and node 1's launcher waits at the barrier: a SIGTERM (its Pod
    deleted) ends it at once, saying it was stopped."""
    coordinator = coordination.Coordinator(0, 2, coordination.Budget(3, 0), 1, print, settle=0.1)
    package = lay_out(tmp_path / "lib")
    (tmp_path / "train.py").write_text("import sys; sys.exit(3)\n")
    env = {
        "PATH": os.environ["PATH"],
        "NODE_RANK": "1",
        "WORLD_SIZE": "2",
        "TORCHYARD_NNODES": "2",
        "TORCHYARD_NPROC_PER_NODE": "1",
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
        "TORCHYARD_SHIPPED_PATH": str(tmp_path / "lib"),
        "TORCHYARD_COORDINATOR": f"127.0.0.1:{coordinator.port}",
        "TORCHYARD_RESTART_BUDGET": coordination.Budget(3, 0).to_json(),
    }
    argv = [sys.executable, "-I", str(launcher(package)), "--", sys.executable, "train.py"]
    node = subprocess.Popen(argv, cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not coordinator.restarts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert coordinator.restarts, "no restart was asked for"
        time.sleep(0.5)  # node 1 stopped its ranks and waits for node 0 at the barrier
        node.send_signal(signal.SIGTERM)
        _, err = node.communicate(timeout=5)
    finally:
        node.kill()
        coordinator.close()
    said = json.loads((tmp_path / "termination.json").read_text())
    assert (node.returncode, said["reason"], said["signal"]) == (143, "Terminated", 15), err
    assert said["inPlace"]["inPlace"] == 1, said


@pytest.mark.parametrize(
    ("report", "waits"),
    [
        (KILLED, False),  # a rank that died is no one's symptom: decided at once
        (RAISED, False),
        ({**KILLED, "reason": "Stalled"}, True),  # every node's detector may see it
        (
            {
                **RAISED,
                "message": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                "Timed out waiting 15000ms for recv operation to complete",
            },
            True,  # a collective timeout: another rank may have failed first
        ),
        ({**RAISED, "message": "RuntimeError: Connection closed by peer"}, True),
    ],
)
def test_only_a_failure_that_may_be_a_symptom_waits_for_the_others(
    report: dict[str, Any], waits: bool
) -> None:
    assert coordination.settles(report) is waits

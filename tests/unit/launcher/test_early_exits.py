"""A node's launcher says which of its ranks exited with status 0 (``earlyExits`` in the
termination message, whatever the node's end), so that ``status.failures.decide`` can
name a rank that left early while its peers trained; and it reads torchrun's summary for
the root-cause rank and that rank's own traceback."""

from __future__ import annotations

from pathlib import Path

from tests.unit.launcher.test_launcher import launch, termination
from torchyard.launch import main, node_launcher, torchrun

# Rank 1 (node 2: ranks 4 and 5 here) leaves at once; rank 0 "loses" it once the launcher
# has reaped it (its process is gone), so the launcher saw it leave first.
LEAVES = """\
import os, sys, time
from pathlib import Path
from torchyard import progress
rank = int(os.environ["RANK"])
if rank % 2 == 1:
    progress.report(3)
    Path(f"pid-{rank}").write_text(str(os.getpid()))
    sys.exit(0)
while not Path(f"pid-{rank + 1}").exists():
    time.sleep(0.01)
pid = int(Path(f"pid-{rank + 1}").read_text() or 0)
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.01)
raise RuntimeError("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [10.0.0.5]:6105")
"""

# Rank 0 fails once rank 1 is ready; rank 1 exits 0 when the launcher stops it for that.
LATE = """\
import os, signal, sys, time
from pathlib import Path
if os.environ["RANK"] == "0":
    while not Path("ready").exists():
        time.sleep(0.01)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
Path("ready").write_text("")
time.sleep(60)
"""


def test_a_rank_that_exited_0_before_the_failure_is_listed(tmp_path: Path) -> None:
    done = launch(
        tmp_path, LEAVES, node_rank=2, extra={"PYTHONPATH": str(Path(main.__file__).parents[2])}
    )
    assert done.returncode == 1, done.stderr
    said = termination(tmp_path)
    assert said["rank"] == 4
    exits = said["earlyExits"]
    assert isinstance(exits, list) and len(exits) == 1
    assert exits[0]["rank"] == 5 and exits[0]["step"] == 3
    assert exits[0]["exitedAt"] < said["exitedAt"]


def test_ranks_that_all_succeeded_are_listed_for_the_other_nodes(tmp_path: Path) -> None:
    done = launch(tmp_path, "import sys\nsys.exit(0)\n", node_rank=1)
    assert done.returncode == 0, done.stderr
    said = termination(tmp_path)
    assert said["reason"] == "Completed"
    assert sorted(e["rank"] for e in said["earlyExits"]) == [2, 3]  # type: ignore[union-attr]


def test_a_rank_that_exited_0_after_the_failure_is_not_listed(tmp_path: Path) -> None:
    done = launch(tmp_path, LATE)
    assert done.returncode == 3, done.stderr
    assert "earlyExits" not in termination(tmp_path)


TORCHRUN_TAIL = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/workspace/train.py", line 24, in <module>
[rank2]: RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:29414
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_10:16:15
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 20360)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_10:16:15
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 20359)
============================================================
"""


def test_torchruns_root_cause_is_the_rank_named_not_the_first_listed() -> None:
    tail = TORCHRUN_TAIL.splitlines(keepends=True)
    assert torchrun.torchrun_root_cause(tail) == 2
    only = [line for line in tail if "Root Cause" not in line]
    assert torchrun.torchrun_root_cause(only) == 3  # no section: the first rank it lists
    assert torchrun.torchrun_root_cause(["no summary\n"]) is None


# torch < 2.2 (Debian's 1.13 in the real node's image): a worker's uncaught error is
# printed as it is, then torchrun's own traceback and summary.
TORCHRUN_TAIL_1_13 = """\
step 9
Traceback (most recent call last):
  File "/workspace/train.py", line 24, in <module>
    loss.backward()
RuntimeError: [/build/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.5]:6105
WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 14 closing signal SIGTERM
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 15)

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/lib/python3/dist-packages/torch/distributed/run.py", line 762, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 20359)
============================================================
"""


def test_before_torch_2_2_the_message_is_the_workers_traceback_not_torchruns() -> None:
    tail = TORCHRUN_TAIL_1_13.splitlines(keepends=True)
    message = torchrun.worker_traceback(tail)
    assert message.startswith("Traceback (most recent call last):")
    assert message.endswith("Connection closed by peer [10.0.0.5]:6105")
    assert "ChildFailedError" not in message and "run.py" not in message
    assert "torch.distributed.elastic" not in message  # torchrun's log lines after it
    # torchrun's traceback alone (a worker that printed none), or a plain traceback: none
    torchrun_only = tail[8:]
    assert torchrun.worker_traceback(torchrun_only) == ""
    assert torchrun.worker_traceback(tail[:5]) == ""


def test_with_torchrun_a_rank_seen_gone_in_the_same_poll_as_the_failed_one_is_listed() -> None:
    """launch: node: the launcher sees torchrun's workers end by polling; a rank that
    exited 0 and the rank torchrun names as failed, both gone by the same poll, carry the
    same time, and the one that exited 0 is listed (its peer failed of losing it)."""
    from types import SimpleNamespace

    node = node_launcher.Launcher(["true"], env={})
    summary = "Root Cause (first observed failure):\n  rank      : 0 (local_rank: 0)\n"
    node.ranks = [SimpleNamespace(rank=None, tail=[summary], exit_code=lambda: 1)]
    node._node_ranks = {0: [100, 1000.5], 1: [101, 1000.5]}  # one poll saw both gone
    [listed] = node._early_exits(1000.5)
    assert (listed["rank"], listed["exitedAt"]) == (1, 1000.5)
    node._node_ranks = {0: [100, 1000.5], 1: [101, 1001.0]}  # a poll later: not the cause
    assert node._early_exits(1000.5) is None

"""The launcher's MPI part, as real processes on this machine: the worker launcher that
serves mpirun's agent (``--rsh``) after an HMAC challenge, and node 0's launcher over an
``mpirun`` stand-in that prints what OpenMPI 4.1 prints (tagged lines, the "first process
to do so" block): per-rank logs, the failing rank with its node and traceback, and the
workers told to end. OpenMPI itself runs in tests/e2e/test_local_mpi.py and on the real
node (tests/node/test_mpi.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import python_3_8
from torchyard.launch import contract, main, mpi_launcher

LAUNCHER = Path(main.__file__)
KEY = "0123456789abcdef" * 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key_file(tmp_path: Path, key: str = KEY) -> Path:
    path = tmp_path / f"key-{abs(hash(key))}"
    path.write_text(key + "\n")
    return path


def base_env(tmp_path: Path, node: int, port: int, **extra: str) -> dict[str, str]:
    folder = tmp_path / f"node-{node}"
    folder.mkdir(exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "TORCHYARD_DISTRIBUTION": "mpi",
        "TORCHYARD_NPROC_PER_NODE": "2",
        "NODE_RANK": str(node),
        "WORLD_SIZE": "4",
        "TORCHYARD_MPI_PORT": str(port),
        "TORCHYARD_MPI_KEY_FILE": str(key_file(tmp_path)),
        "TORCHYARD_MPI_HOSTFILE": "localhost slots=2\n127.0.0.1 slots=2\n",
        "TORCHYARD_LOGS": str(folder / "logs"),
        "TORCHYARD_OUTPUTS": str(folder / "outputs"),
        "TORCHYARD_TERMINATION_LOG": str(folder / "termination.json"),
        "TORCHYARD_DNS_TIMEOUT": "60",
        "TORCHYARD_MPI_END_WAIT": "2",
        **extra,
    }


def start_worker(tmp_path: Path, port: int, python: str = sys.executable) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [python, str(LAUNCHER), "--", "unused"],
        env=base_env(tmp_path, 1, port),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while True:  # its port accepts once it listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return proc
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker launcher never listened"
            time.sleep(0.1)


def agent(
    port: int, key: Path, command: str, python: str = sys.executable
) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "TORCHYARD_MPI_PORT": str(port)}
    env["TORCHYARD_MPI_KEY_FILE"] = str(key)
    return subprocess.Popen(
        [python, str(LAUNCHER), "--rsh", "127.0.0.1", command],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def termination(tmp_path: Path, node: int) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (tmp_path / f"node-{node}" / "termination.json").read_text()
    )
    return data


def test_the_agent_runs_a_command_on_the_worker_and_returns_its_output_and_status(
    tmp_path: Path,
) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    run = agent(port, key_file(tmp_path), "echo out-$NODE_RANK; echo err >&2; exit 7")
    out, err = run.communicate(timeout=60)
    assert run.returncode == 7
    assert out == "out-1\n"  # run with the worker launcher's variables
    assert "err\n" in err
    # node 0 says mpirun ended: the worker launcher ends with it
    mpi_launcher.mpi_request("127.0.0.1", port, KEY.encode(), {"end": 0}).close()
    _, worker_err = worker.communicate(timeout=60)
    assert worker.returncode == 0, worker_err
    assert "node 1: mpirun ended (exit code 0)" in worker_err
    assert "refused" not in worker_err  # start_worker's readiness probe is no refusal
    assert termination(tmp_path, 1) == {"nodeRank": 1, "exitCode": 0, "reason": "Completed"}


@pytest.mark.skipif(python_3_8() is None, reason="no Python 3.8 on this machine")
def test_the_worker_and_its_agent_run_on_python_3_8(tmp_path: Path) -> None:
    """The oldest Python the launcher supports: the worker goes on listening past its
    accept timeout (socket.timeout is TimeoutError only from Python 3.10 on)."""
    python = str(python_3_8())
    port = free_port()
    worker = start_worker(tmp_path, port, python)
    time.sleep(1)  # several of the worker's accept timeouts
    run = agent(port, key_file(tmp_path), "echo out-$NODE_RANK", python)
    out, err = run.communicate(timeout=60)
    assert (run.returncode, out) == (0, "out-1\n"), err
    mpi_launcher.mpi_request("127.0.0.1", port, KEY.encode(), {"end": 0}).close()
    _, worker_err = worker.communicate(timeout=60)
    assert worker.returncode == 0, worker_err
    assert "node 1: mpirun ended (exit code 0)" in worker_err


def test_a_worker_whose_orted_ended_does_not_wait_forever_for_node_0(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    run = agent(port, key_file(tmp_path), "exit 0")
    run.communicate(timeout=60)
    _, worker_err = worker.communicate(timeout=60)  # TORCHYARD_MPI_END_WAIT=2 later
    assert worker.returncode == 0
    assert "node 1: its orted ended; node 0 did not say how mpirun did" in worker_err


def test_a_wrong_key_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    marker = tmp_path / "ran"
    run = agent(port, key_file(tmp_path, "f" * 64), f"touch {marker}")
    _, err = run.communicate(timeout=60)
    assert run.returncode == 255
    assert "cannot reach node 127.0.0.1" in err or "lost node 127.0.0.1" in err
    assert not marker.exists()
    assert worker.poll() is None  # still waiting for mpirun's real agent
    mpi_launcher.mpi_request(
        "127.0.0.1", port, KEY.encode(), {"end": 0}
    ).close()  # what node 0 sends when mpirun ended
    _, worker_err = worker.communicate(timeout=60)
    assert worker.returncode == 0
    assert "refused a connection (wrong MPI key)" in worker_err


def test_when_the_agent_goes_away_its_command_is_killed(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    pid_file = tmp_path / "pid"
    run = agent(port, key_file(tmp_path), f"echo $$ > {pid_file}; exec sleep 600")
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    run.kill()  # mpirun's side of the channel drops
    run.wait(timeout=30)
    worker.communicate(timeout=60)
    assert worker.returncode == 0
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


FAKE_MPIRUN = r'''#!{python}
"""Prints what OpenMPI 4.1's mpirun prints; calls the rsh agent like mpirun does."""
import os, subprocess, sys
args = sys.argv[1:]
agent = args[args.index("plm_rsh_agent") + 1].split() if "plm_rsh_agent" in args else None
with open("{record}", "w") as f:
    f.write(repr(args))
with open(args[args.index("--hostfile") + 1]) as src, open("{record}.hostfile", "w") as f:
    f.write(src.read())
with open("{record}.env", "w") as f:  # what the ranks on node 0 would inherit
    f.write(repr({{k: v for k, v in os.environ.items() if k.startswith("TORCHYARD_RESUME")}}))
print("[1,0]<stdout>:hello from rank 0", flush=True)
if "{progress}" == "yes":  # torchyard.progress.report() in ranks 0 and 3
    print('[1,0]<stdout>:@@torchyard {{"step": 4, "total": 10, "loss": 0.5}}', flush=True)
    print('[1,3]<stdout>:@@torchyard {{"step": 2, "total": 10, "loss": 0.9}}', flush=True)
print("[1,1]<stdout>:hello from rank 1[1,1]<stdout>:", flush=True)
# two ranks on one node that write their text and its newline apart (print() under
# PYTHONUNBUFFERED): OpenMPI tags each write, and the writes of two ranks share a line
sys.stdout.write("[1,3]<stdout>:text of rank 3[1,1]<stdout>:text of rank 1"
                 "[1,3]<stdout>:\n[1,1]<stdout>:\n")
sys.stdout.flush()
if agent:
    code = subprocess.call(agent + ["127.0.0.1", "echo '[1,2]<stdout>:'rank 2 on node $NODE_RANK"])
    sys.stdout.flush()
    if code:
        sys.exit(code)
if "{fail}" != "no":
    err = sys.stderr
    err.write("[1,3]<stderr>:Traceback (most recent call last):\n")
    err.write('[1,3]<stderr>:  File "train.py", line 9, in <module>\n')
    err.write("[1,3]<stderr>:    [1,3]<stderr>:raise ValueError('rank 3 broke')\n")
    err.write("[1,3]<stderr>:ValueError[1,3]<stderr>:: rank 3 broke\n")
    if "{fail}" == "hangs":  # reports the abort, then stays behind with every rank gone
        err.write("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\n"
                  "with errorcode 1.\n")
        err.flush()
        import time
        time.sleep(3600)
    if "{fail}" == "lost":  # OpenMPI 4.1's show_help race drops the MPI_ABORT report
        err.write("[vm:23941] [[12667,0],0] ORTE_ERROR_LOG: Data unpack would read past end "
                  "of buffer in file ../../../orte/util/show_help.c at line 501\n")
        sys.exit(1)
    if "{fail}" == "lost-hangs":  # the same race, then mpirun stays with every rank gone
        err.write("[vm:10009] [[19431,0],0] ORTE_ERROR_LOG: Data unpack had inadequate "
                  "space in file ../../../orte/util/show_help.c at line 513\n")
        err.flush()
        import time
        time.sleep(3600)
    if "{fail}" == "abort":  # python -m mpi4py: MPI_Abort on the exception
        err.write("-" * 74 + "\nMPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD"
                  "\nwith errorcode 1.\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill "
                  "all MPI processes.\n" + "-" * 74 + "\n")
        sys.exit(1)
    if "{fail}" == "abort-then-crash":  # rank 1 crashed while the abort tore it down, and
        # mpirun reported its exit as the first non-zero one
        err.write("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\n"
                  "with errorcode 1.\n")
        err.write("mpirun detected that one or more processes exited with non-zero status, "
                  "thus causing\nthe job to be terminated. The first process to do so was:"
                  "\n\n  Process name: [[4242,1],1]\n  Exit code:    139\n")
        sys.exit(1)
    err.write("-" * 74 + "\nPrimary job  terminated normally, but 1 process returned\n")
    err.write("a non-zero exit code. Per user-direction, the job has been aborted.\n")
    err.write("-" * 74 + "\nmpirun detected that one or more processes exited with non-zero "
              "status, thus causing\nthe job to be terminated. The first process to do so "
              "was:\n\n  Process name: [[4242,1],3]\n  Exit code:    1\n" + "-" * 74 + "\n")
    sys.exit(1)
'''


def fake_mpirun(tmp_path: Path, fail: bool | str, progress: bool = False) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "mpirun"
    script.write_text(
        FAKE_MPIRUN.format(
            python=sys.executable,
            record=tmp_path / "argv",
            fail=fail if isinstance(fail, str) else ("yes" if fail else "no"),
            progress="yes" if progress else "no",
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def node0(
    tmp_path: Path, port: int, folder: Path, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = base_env(tmp_path, 0, port, TORCHYARD_MPIRUN_ARGS='["-np", "4", "--tag-output"]')
    env.update(extra)
    env["PATH"] = f"{folder}:{env['PATH']}"
    return subprocess.run(
        [sys.executable, str(LAUNCHER), "--", "python3", "train.py"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )


def test_node_0_runs_mpirun_over_the_hostfile_with_itself_as_agent(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    done = node0(tmp_path, port, fake_mpirun(tmp_path, fail=False))
    assert done.returncode == 0, done.stderr
    argv = eval((tmp_path / "argv").read_text())
    hostfile = Path(argv[argv.index("--hostfile") + 1])
    assert (tmp_path / "argv.hostfile").read_text() == "localhost slots=2\n127.0.0.1 slots=2\n"
    assert not hostfile.parent.exists()  # its temporary folder is gone with mpirun
    assert argv[argv.index("plm_rsh_agent") + 1] == f"{sys.executable} {LAUNCHER} --rsh"
    assert argv[-2:] == ["python3", "train.py"]
    logs = tmp_path / "node-0" / "logs"
    assert (logs / "rank-0.txt").read_text() == "hello from rank 0\n"
    assert (logs / "rank-1.txt").read_text() == "hello from rank 1\ntext of rank 1\n"
    assert (logs / "rank-2.txt").read_text() == "rank 2 on node 1\n"  # through the agent
    assert (logs / "rank-3.txt").read_text() == "text of rank 3\n"
    assert "[rank 1] hello from rank 1\n" in done.stdout
    # each rank's writes put back together on a line of its own
    assert "[rank 3] text of rank 3\n" in done.stdout, done.stdout
    assert "[rank 1] text of rank 1\n" in done.stdout, done.stdout
    assert termination(tmp_path, 0) == {"nodeRank": 0, "exitCode": 0, "reason": "Completed"}
    worker.communicate(timeout=60)
    assert worker.returncode == 0


@pytest.mark.parametrize(
    "how",
    ["yes", "abort", "abort-then-crash", "lost", "hangs", "lost-hangs"],
    ids=[
        "exit",
        "mpi-abort",
        "a-rank-torn-down-by-the-abort-crashed-and-was-reported-first",
        "abort-report-lost",
        "mpirun-stays-after-abort",
        "mpirun-stays-after-the-report-is-lost",
    ],
)
def test_a_failing_rank_is_named_with_its_node_and_traceback(tmp_path: Path, how: str) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    done = node0(tmp_path, port, fake_mpirun(tmp_path, fail=how))
    assert done.returncode == 1
    info = termination(tmp_path, 0)
    assert info["rank"] == 3
    assert info["rankNode"] == 1  # map-by slot, 2 slots a node
    assert info["exitCode"] == 1
    assert info["reason"] == "Error"
    assert info["message"] == (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 9, in <module>\n'
        "    raise ValueError('rank 3 broke')\n"
        "ValueError: rank 3 broke"
    )
    assert "ValueError: rank 3 broke" in (tmp_path / "node-0" / "logs" / "rank-3.txt").read_text()
    worker.communicate(timeout=60)  # told to end although its orted already had
    assert worker.returncode == 0


def test_node_0_names_the_worker_that_never_listens(tmp_path: Path) -> None:
    env = base_env(tmp_path, 0, free_port(), TORCHYARD_DNS_TIMEOUT="1")
    env["PATH"] = f"{fake_mpirun(tmp_path, fail=False)}:{env['PATH']}"
    done = subprocess.run(
        [sys.executable, str(LAUNCHER), "--", "python3", "train.py"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2
    message = str(termination(tmp_path, 0)["message"])
    assert "MPI: node 1 (127.0.0.1:" in message
    assert "did not accept connections within 1s" in message
    assert not (tmp_path / "argv").exists()  # mpirun never started


def test_a_worker_stopped_by_sigterm_ends_its_command(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM
    assert termination(tmp_path, 1)["reason"] == "Terminated"


def test_node_0_publishes_the_progress_every_mpi_rank_reports(tmp_path: Path) -> None:
    """``@@torchyard`` lines of any rank (mpirun gathers them on node 0) become the node's
    ``[torchyard] progress`` line and its termination message's summary, as for PyTorch
    runs; the last metric values (rank 0's win) go to outputs/metrics.json."""
    port = free_port()
    worker = start_worker(tmp_path, port)
    folder = fake_mpirun(tmp_path, fail=False, progress=True)
    done = node0(tmp_path, port, folder, TORCHYARD_PROGRESS_INTERVAL="1")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(contract.PROGRESS_LINE)]
    assert lines, done.stderr
    summary = json.loads(lines[-1][len(contract.PROGRESS_LINE) :])
    assert (summary["step"], summary["minStep"], summary["total"]) == (4, 2, 10), summary
    assert summary["metrics"] == {"loss": 0.5}
    assert termination(tmp_path, 0)["progress"] == summary
    node = tmp_path / "node-0"
    records = [json.loads(ln) for ln in (node / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["rank"], r["step"]) for r in records] == [(0, 4), (3, 2)]
    assert json.loads((node / "outputs" / "metrics.json").read_text())["loss"] == 0.5
    assert '@@torchyard {"step": 4' in (node / "logs" / "rank-0.txt").read_text()
    worker.communicate(timeout=60)


def test_a_failing_mpi_rank_is_reported_with_its_last_step(tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(tmp_path, port)
    done = node0(tmp_path, port, fake_mpirun(tmp_path, fail=True, progress=True))
    assert done.returncode == 1, done.stderr
    info = termination(tmp_path, 0)
    assert (info["rank"], info["step"]) == (3, 2)  # the step rank 3 reported last
    assert isinstance(info["progress"], dict) and info["progress"]["step"] == 4
    worker.communicate(timeout=60)


def test_node_0_completes_mpi_ranks_checkpoints_and_resumes_them_from_the_newest(
    tmp_path: Path,
) -> None:
    """With TORCHYARD_CHECKPOINT_DIR, node 0's MPI launcher keeps the checkpoint contract
    of PyTorch runs: it writes COMPLETE.json where all 4 ranks said done, and mpirun's
    ranks get TORCHYARD_RESUME_FROM/STEP of the newest complete checkpoint."""
    folder = tmp_path / "checkpoints"
    step = folder / "step-5"
    step.mkdir(parents=True)
    for rank in range(4):
        (step / f"rank-{rank}.pt").write_bytes(b"weights %d" % rank)
        (step / f"rank-{rank}.done").write_text("")
    port = free_port()
    worker = start_worker(tmp_path, port)
    done = node0(
        tmp_path, port, fake_mpirun(tmp_path, fail=False), TORCHYARD_CHECKPOINT_DIR=str(folder)
    )
    assert done.returncode == 0, done.stderr
    complete = json.loads((step / "COMPLETE.json").read_text())
    assert (complete["step"], complete["worldSize"]) == (5, 4)
    assert {f"rank-{r}.pt" for r in range(4)} <= {f["name"] for f in complete["files"]}
    seen = eval((tmp_path / "argv.env").read_text())
    assert seen == {"TORCHYARD_RESUME_FROM": str(step), "TORCHYARD_RESUME_STEP": "5"}
    info = termination(tmp_path, 0)
    assert (info["resumedFrom"], info["checkpointStep"]) == (5, 5)
    worker.communicate(timeout=60)


def test_checkpoint_done_under_mpirun_is_the_mpi_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An mpirun rank has OMPI_COMM_WORLD_RANK and no RANK: its ``done`` is its own."""
    from torchyard import checkpoint

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    path = checkpoint.save_dir(7, str(tmp_path))
    (Path(path) / "rank-3.pt").write_bytes(b"x")
    checkpoint.done(7, str(tmp_path))
    checkpoint.report(7, str(tmp_path))
    assert sorted(p.name for p in Path(path).iterdir()) == ["rank-3.done", "rank-3.pt"]
    assert checkpoint.reported(str(tmp_path)) == {3: 7}
    monkeypatch.setenv("RANK", "1")  # torchyard's RANK, where there is one, wins
    checkpoint.done(7, str(tmp_path))
    assert (Path(path) / "rank-1.done").is_file()

"""The launcher, run as a real process over small Python children: rank variables,
log teeing, fail-fast with the failing rank's traceback, signal forwarding, bounded
termination messages, and standard-library-only modules."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torchyard
from torchyard import envbuild
from torchyard.launch import contract, main, node_files, ranks
from torchyard.planning import pods

LAUNCHER = Path(main.__file__)


def launch(
    tmp_path: Path,
    script: str,
    nproc: int = 2,
    node_rank: int = 0,
    extra: dict[str, str] | None = None,
    wait: bool = True,
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    (tmp_path / "child.py").write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "TORCHYARD_NPROC_PER_NODE": str(nproc),
        "NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(nproc * 2),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
        "TORCHYARD_GRACE_PERIOD": "2",
        **(extra or {}),
    }
    argv = [sys.executable, str(LAUNCHER), "--", sys.executable, "child.py"]
    if not wait:
        return subprocess.Popen(
            argv, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    return subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)


def termination(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "termination.json").read_text())
    return data


def test_process_env_adds_global_and_local_rank() -> None:
    node = {"TORCHYARD_NPROC_PER_NODE": "4", "NODE_RANK": "2", "WORLD_SIZE": "12"}
    env = contract.process_env(node, 3)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("11", "3", "12")


def test_ranks_run_with_their_variables_and_logs_are_teed(tmp_path: Path) -> None:
    done = launch(
        tmp_path,
        "import os; print('hello', os.environ['RANK'], "
        "os.environ['LOCAL_RANK'], os.environ['OMP_NUM_THREADS'])",
        node_rank=1,
    )
    assert done.returncode == 0, done.stderr
    assert "[rank 2] hello 2 0 1" in done.stdout
    assert "[rank 3] hello 3 1 1" in done.stdout
    assert (tmp_path / "logs" / "rank-2.txt").read_text() == "hello 2 0 1\n"
    assert (tmp_path / "outputs").is_dir()
    assert termination(tmp_path)["exitCode"] == 0


def test_first_failing_rank_stops_the_others_and_is_reported(tmp_path: Path) -> None:
    script = (
        "import os, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.2)\n"
        "    raise KeyError('missing batch')\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done = launch(tmp_path, script)
    assert time.monotonic() - started < 20, "the surviving rank was not stopped"
    assert done.returncode == 1
    info = termination(tmp_path)
    assert info["rank"] == 1 and info["localRank"] == 1 and info["nodeRank"] == 0
    assert info["exitCode"] == 1 and info["reason"] == "Error"
    message = str(info["message"])
    assert message.startswith("Traceback (most recent call last)")
    assert message.endswith("KeyError: 'missing batch'")
    assert "rank 1 exited with exit code 1: stopping the other ranks" in done.stderr


def test_a_rank_killed_by_a_signal_is_reported_with_the_signal(tmp_path: Path) -> None:
    done = launch(
        tmp_path,
        "import os, signal\nif os.environ['RANK'] == '0':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n",
        nproc=1,
    )
    info = termination(tmp_path)
    assert done.returncode == 128 + signal.SIGKILL
    assert info["signal"] == signal.SIGKILL and info["rank"] == 0


def cgroup(root: Path, version: int, oom_kills: int, limit: str) -> None:
    """A memory cgroup as runc mounts it in a container (v1: under memory/)."""
    if version == 2:
        root.mkdir(parents=True, exist_ok=True)
        (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 4\noom {oom_kills}\n"
                                            f"oom_kill {oom_kills}\n")  # fmt: skip
        (root / "memory.max").write_text(limit + "\n")
    else:
        (root / "memory").mkdir(parents=True, exist_ok=True)
        (root / "memory" / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n"
        )
        (root / "memory" / "memory.limit_in_bytes").write_text(limit + "\n")


# Rank 1 stands in for a rank the OOM killer ends: the kernel's count goes up, then SIGKILL.
OOM_RANK = (
    "import os, signal, sys, time\n"
    "if os.environ['RANK'] == '1':\n"
    "    print('allocating', flush=True)\n"
    "    path = sys.argv[1]\n"
    "    text = open(path).read().replace('oom_kill 0', 'oom_kill 1')\n"
    "    open(path, 'w').write(text)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("version", [1, 2])
def test_a_rank_the_oom_killer_ended_is_reported_as_oomkilled_with_the_limit(
    tmp_path: Path, version: int
) -> None:
    root = tmp_path / "cgroup"
    cgroup(root, version, 0, str(200 << 20))
    events = root / ("memory.events" if version == 2 else "memory/memory.oom_control")
    (tmp_path / "child.py").write_text(OOM_RANK)
    env = {
        "PATH": os.environ["PATH"],
        "TORCHYARD_NPROC_PER_NODE": "2",
        "NODE_RANK": "0",
        "WORLD_SIZE": "2",
        "TORCHYARD_TERMINATION_LOG": str(tmp_path / "termination.json"),
        "TORCHYARD_GRACE_PERIOD": "2",
        "TORCHYARD_CGROUP_ROOT": str(root),
    }
    argv = [sys.executable, str(LAUNCHER), "--", sys.executable, "child.py", str(events)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    info = termination(tmp_path)
    assert (info["reason"], info["rank"], info["exitCode"], info["signal"]) == (
        "OOMKilled",
        1,
        137,
        signal.SIGKILL,
    ), info
    message = str(info["message"])
    assert message.startswith("rank 1 was killed by the kernel's OOM killer"), message
    assert "over its memory limit (200Mi)" in message and "spec.resources.memory" in message


def test_a_sigkill_without_an_oom_kill_is_not_called_oomkilled(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    cgroup(root, 1, 2, "9223372036854771712")  # earlier kills, no limit: count unchanged
    done = launch(
        tmp_path,
        "import os, signal\nif os.environ['RANK'] == '0':\n"
        "    print('bye', flush=True)\n    os.kill(os.getpid(), signal.SIGKILL)\n",
        nproc=1,
        extra={"TORCHYARD_CGROUP_ROOT": str(root)},
    )
    assert done.returncode == 128 + signal.SIGKILL
    info = termination(tmp_path)
    assert info["reason"] == "Error" and "OOM" not in str(info.get("message")), info


def test_the_memory_limit_reads_as_kubernetes_writes_it(tmp_path: Path) -> None:
    for version, limit, shown in ((2, "max", None), (1, "9223372036854771712", None),
                                  (2, str(3 << 30), "3Gi"), (1, "1000", "1000")):  # fmt: skip
        root = tmp_path / f"v{version}-{limit}"
        cgroup(root, version, 0, limit)
        found = ranks.memory_limit(str(root))
        assert (ranks._quantity(found) if found else None) == shown
    assert ranks.oom_kills(str(tmp_path / "none")) is None


def test_sigterm_is_forwarded_to_the_ranks(tmp_path: Path) -> None:
    proc = launch(
        tmp_path, "import time, os\nprint('up', flush=True)\ntime.sleep(60)\n", wait=False
    )
    assert isinstance(proc, subprocess.Popen)
    assert proc.stdout is not None
    for _ in range(2):
        assert "up" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert termination(tmp_path)["reason"] == "Terminated"


def test_missing_command_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, TORCHYARD_TERMINATION_LOG=str(tmp_path / "t.json"))
    done = subprocess.run(
        [sys.executable, str(LAUNCHER), "--", "no-such-trainer"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "cannot start 'no-such-trainer'" in done.stderr
    assert json.loads((tmp_path / "t.json").read_text())["reason"] == "LaunchError"


def test_unresolvable_master_addr_times_out_with_a_clear_error(tmp_path: Path) -> None:
    done = launch(
        tmp_path,
        "print('never')",
        extra={"MASTER_ADDR": "no-such-host.torchyard.invalid", "TORCHYARD_DNS_TIMEOUT": "1"},
    )
    assert done.returncode == 2
    assert "MASTER_ADDR no-such-host.torchyard.invalid did not resolve within 1s" in done.stderr
    assert "never" not in done.stdout


def test_termination_message_fits_4kib_and_keeps_the_end() -> None:
    huge = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: the end"
    text = contract.termination_message({"rank": 3, "message": huge})
    assert len(text.encode()) <= 4096
    assert json.loads(text)["message"].endswith("ValueError: the end")


def test_traceback_tail_picks_the_last_traceback() -> None:
    lines = [
        "noise",
        "Traceback (most recent call last):",
        "  old",
        "OldError",
        "more",
        "Traceback (most recent call last):",
        '  File "x"',
        "NewError: boom",
    ]
    assert contract.traceback_tail(lines) == (
        'Traceback (most recent call last):\n  File "x"\nNewError: boom'
    )


OPERATOR = Path(torchyard.__file__).parent
SHIPPED = [OPERATOR / path for path in pods.shipped_files() if path != "__init__.py"]


@pytest.mark.parametrize(
    "path", [*SHIPPED, Path(envbuild.__file__)], ids=lambda path: str(path.relative_to(OPERATOR))
)
def test_runs_in_user_images_on_the_standard_library_and_python_3_8(path: Path) -> None:
    """Every shipped module imports only the standard library and the other shipped
    modules (never ``torchyard.launch.main``, the entry point); the Environment builder, a
    single file, only the standard library and the launch contract (copied beside it)."""
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    shipped = {p[:-3].replace("/", ".").removesuffix(".__init__") for p in pods.shipped_files()}
    # (``python -m torchyard.launch`` runs the entry point: its __main__ imports it)
    entry = {"launch.main"} if path.name == "__main__.py" else set()
    siblings = (shipped - {"__init__", "launch.main"}) | entry if path in SHIPPED else set()
    if path == Path(envbuild.__file__):
        siblings = {"launch.contract"}
    imported = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "relative imports would break a module run as a file"
            names = [node.module]
            if (OPERATOR.parent / node.module.replace(".", "/")).is_dir():  # a package's modules
                names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top, _, rest = name.partition(".")
            if top == "torchyard":
                assert rest in siblings, f"{path.name} imports {name}"
            else:
                imported.add(top)
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


@pytest.mark.parametrize("code", [0, 3], ids=["ranks-succeed", "a-rank-fails"])
def test_the_stack_hook_is_there_while_the_ranks_run_and_gone_after(
    tmp_path: Path, code: int
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = (
        "import os, sys\n"
        "hook = os.environ['PYTHONPATH'].split(os.pathsep)[-1]\n"
        "print('hook', os.path.isfile(os.path.join(hook, 'sitecustomize.py')),"
        " 'sitecustomize' in sys.modules, hook.startswith(os.environ['TMPDIR']))\n"
        # rank 0 fails after it printed (were it rank 1 to fail first, the launcher would
        # stop rank 0, perhaps before its line: a race on a loaded machine)
        f"raise SystemExit({code} if os.environ['RANK'] == '0' else 0)\n"
    )
    done = launch(tmp_path, script, extra={"TMPDIR": str(scratch)})
    assert done.returncode == code, done.stderr
    assert "[rank 0] hook True True True" in done.stdout
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("mode", ["process", "node"])
def test_every_process_the_ranks_start_imports_the_launchers_torchyard(
    tmp_path: Path, mode: str
) -> None:
    """As torchrun's workers under another environment's Python: a child interpreter that
    has no torchyard of its own (``-S``: no site-packages) imports the launcher's, from a
    folder gone once the ranks are."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = (
        "import subprocess, sys\n"
        "code = 'import os, torchyard.progress as p; print(os.path.realpath(p.__file__))'\n"
        "subprocess.run([sys.executable, '-S', '-c', code], check=True)\n"
    )
    done = launch(
        tmp_path, script, nproc=1, extra={"TORCHYARD_LAUNCH": mode, "TMPDIR": str(scratch)}
    )
    assert done.returncode == 0, done.stderr
    progress = Path(torchyard.__file__).resolve().parent / "progress.py"
    assert done.stdout.split("] ", 1)[1].strip() == str(progress), done.stdout
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("mode", ["process", "node"])
def test_launch_modes(tmp_path: Path, mode: str) -> None:
    done = launch(
        tmp_path,
        "import os; print('rank', os.environ.get('RANK'))",
        extra={"TORCHYARD_LAUNCH": mode},
    )
    assert done.returncode == 0
    if mode == "process":
        assert "[rank 0] rank 0" in done.stdout and "[rank 1] rank 1" in done.stdout
    else:  # once per node, RANK left to torchrun
        assert done.stdout.strip() == "[node 0] rank None"


def test_arguments_name_the_rank_contract_and_are_expanded_per_process() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1", "MASTER_PORT": "29500"}
    command = ["python", "t.py", "--rank", "$RANK", "--lr=${LOCAL_RANK}", "$NODE_RANK"]
    assert contract.expand_arguments(command, env) == [
        "python",
        "t.py",
        "--rank",
        "3",
        "--lr=1",
        "1",
    ]
    # Other variables and look-alikes are left alone.
    assert contract.expand_arguments(["$HOME", "$RANKS", "$$"], env) == [
        "$HOME",
        "$RANKS",
        "$$",
    ]


def test_a_snapshot_is_unpacked_into_the_workspace_and_cannot_escape_it(tmp_path: Path) -> None:
    import io
    import tarfile

    from torchyard.sdk import snapshots

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "m.py").write_text("X = 1\n")
    volume = tmp_path / "configmap"
    volume.mkdir()
    with snapshots.snapshot(src) as snap:
        (volume / contract.SNAPSHOT).write_bytes(snap.data())
    work = tmp_path / "work"
    code = node_files.prepare(["--copy", str(volume), str(work)])
    assert code == 0
    assert (work / "pkg" / "m.py").read_text() == "X = 1\n"
    assert (work / "train.py").read_text() == "print('hi')\n"

    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        info = tarfile.TarInfo("../outside.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil.tar.gz").write_bytes(evil.getvalue())
    with pytest.raises(contract.LaunchError, match="outside the folder"):
        node_files.extract_snapshot(str(tmp_path / "evil.tar.gz"), str(tmp_path / "w2"))
    assert not (tmp_path / "outside.py").exists()

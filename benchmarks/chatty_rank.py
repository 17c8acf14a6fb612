"""What a chatty rank costs its own training, through the real launcher.

Runs the launcher (one node, one rank) over a script whose steps each burn ``--step-ms``
of CPU in ten slices and, between the slices, write to stdout whatever keeps their
output at ``--mbps`` MB/s (lines of about 120 bytes, a write per slice, as a logger that
buffers would), twice per round, rounds interleaved: once quiet (the baseline: no output
but a last line), once chatty. The launcher's own output goes to a reader as slow as a
terminal (``--terminal-mbps``). Each round gives one paired ratio (the chatty run's steps
per second / the quiet run's): load that changes between rounds cancels within a pair,
and the order's own bias (quiet first in even rounds) cancels over the rounds. The
figure is the median of the paired ratios; the target is at least 0.8. It also says how
big the rank's log is against its limit (TORCHYARD_LOG_LIMIT_BYTES, ``--limit-mib``) and
how much of its output reached the "terminal", and the launcher's CPU time per MB the
rank wrote (beyond the quiet run's; CPU time, which load changes less than a rate). Last,
one run whose rank starts a helper process in a session of its own that holds the rank's
stdout, writes for two seconds and exits: how long after the node's end (the launcher's
exit) the helper is gone (target: at most 5 s; before the end is negative), and how long
the node took to end after its rank.

    .venv/bin/python benchmarks/chatty_rank.py [--seconds 10] [--mbps 50] [--rounds 3]
    .venv/bin/python benchmarks/chatty_rank.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import record

from torchyard.launch.ranks import alive

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = Path(
    os.environ.get("CHATTY_LAUNCHER", ROOT / "operator" / "torchyard" / "launch" / "main.py")
)

SCRIPT = """
import json, os, sys, time
seconds, step_s, rate = float(sys.argv[1]), float(sys.argv[2]) / 1000, float(sys.argv[3]) * 1e6
line = b"2024-01-01 12:00:00,000 INFO trainer: step %08d loss=0.123456 lr=0.000100 " \\
    b"grad_norm=1.234567 samples/s=1234.5 ..........\\n"
block = b"".join(line % i for i in range(20000))  # 2.4 MB of lines to cut writes from
out = sys.stdout.buffer
written, steps, at = 0, 0, 0
started = time.perf_counter()
while time.perf_counter() - started < seconds:
    for _ in range(10):  # a step: ten slices of work, the output owed after each
        end = time.perf_counter() + step_s / 10
        while time.perf_counter() < end:
            pass
        owed = int(rate * (time.perf_counter() - started)) - written
        while owed > 0 and time.perf_counter() - started < seconds:
            piece = block[at : at + min(owed, len(block) - at)]
            out.write(piece)
            at = (at + len(piece)) % len(block)
            owed -= len(piece)
            written += len(piece)
        out.flush()
    steps += 1
elapsed = time.perf_counter() - started
with open("result.json", "w") as f:
    cpu = sum(os.times()[:2])
    json.dump({"steps": steps, "seconds": elapsed, "written": written, "cpu": cpu}, f)
print("done", flush=True)
"""


def slow_reader(pipe: object, mbps: float, counted: list[int]) -> None:
    """Read ``pipe`` no faster than ``mbps`` MB/s, as a terminal draws."""
    fd = pipe.fileno()  # type: ignore[attr-defined]
    started = time.monotonic()
    while True:
        data = os.read(fd, 65536)
        if not data:
            return
        counted[0] += len(data)
        ahead = counted[0] / (mbps * 1e6) - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)


HELPER = """
import json, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)  # its own session, holding our stdout
with open("helper.tmp", "w") as f:
    f.write(str(helper.pid))
__import__("os").rename("helper.tmp", "helper.pid")
block = b"a chatty rank's line, as a logger writes it ..........................\\n" * 1000
end = time.time() + float(sys.argv[1])
while time.time() < end:
    sys.stdout.buffer.write(block)
sys.stdout.flush()
with open("rank.json", "w") as f:
    json.dump({"ended": time.time()}, f)
"""


def start(tmp: str, script: str, arguments: list[str], terminal: float, limit: int) -> tuple:
    """The launcher over ``script`` in ``tmp``, its output read as a terminal would."""
    Path(tmp, "bench.py").write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "TORCHYARD_NPROC_PER_NODE": "1",
        "NODE_RANK": "0",
        "WORLD_SIZE": "1",
        "TORCHYARD_TERMINATION_LOG": str(Path(tmp, "termination.json")),
        "TORCHYARD_LOG_LIMIT_BYTES": str(limit),
    }
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER), "--", sys.executable, "bench.py", *arguments],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    shown, said = [0], [0]
    readers = [
        threading.Thread(target=slow_reader, args=(proc.stdout, terminal, shown)),
        threading.Thread(target=slow_reader, args=(proc.stderr, terminal, said)),
    ]
    for t in readers:
        t.start()
    return proc, readers, shown, said


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def one(seconds: float, step_ms: float, mbps: float, terminal: float, limit: int) -> dict:
    """Steps per second of the rank, its log's size and what the terminal got."""
    with tempfile.TemporaryDirectory() as tmp:
        arguments = [str(seconds), str(step_ms), str(mbps)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc, readers, shown, said = start(tmp, SCRIPT, arguments, terminal, limit)
        code = proc.wait(timeout=seconds * 10 + 60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the launcher and its rank
        for t in readers:
            t.join()
        assert code == 0, f"the launcher exited with {code}"
        result = json.loads(Path(tmp, "result.json").read_text())
        log = Path(tmp, "logs", "rank-0.txt")
        text = log.read_bytes()
        at = text.find(b"[torchyard] ", text.find(b"dropped here") - 200)
        note = text[at : text.find(b"\n", at)].decode() if b"dropped here" in text else ""
        return {
            "rate": result["steps"] / result["seconds"],
            "written": result["written"],
            "log": log.stat().st_size,
            "note": note,
            "shown": shown[0] + said[0],
            "launcher_cpu": cpu_seconds(after) - cpu_seconds(before) - result["cpu"],
        }


def helper(terminal: float, limit: int) -> dict:
    """When the rank, the node and the helper the rank started ended (time.time())."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, readers, _, _ = start(tmp, HELPER, ["2"], terminal, limit)
        pid_file, gone = Path(tmp, "helper.pid"), [float("inf")]
        while not pid_file.exists() and proc.poll() is None:
            time.sleep(0.01)
        pid = int(pid_file.read_text())

        def watch() -> None:
            deadline = time.time() + 120
            while alive(pid) and time.time() < deadline:
                time.sleep(0.01)
            if not alive(pid):
                gone[0] = time.time()

        watcher = threading.Thread(target=watch)
        watcher.start()
        code = proc.wait(timeout=120)
        node = time.time()
        for t in (*readers, watcher):
            t.join()
        if alive(pid):
            os.kill(pid, 9)
        assert code == 0, f"the launcher exited with {code}"
        rank = json.loads(Path(tmp, "rank.json").read_text())["ended"]
        return {"rank": rank, "node": node, "helper": gone[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of each run")
    parser.add_argument("--step-ms", type=float, default=60.0, help="CPU per step (16/s)")
    parser.add_argument("--mbps", type=float, default=50.0, help="the chatty rank's output")
    parser.add_argument("--terminal-mbps", type=float, default=2.0, help="what is read")
    parser.add_argument("--limit-mib", type=int, default=64, help="TORCHYARD_LOG_LIMIT_BYTES")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.limit_mib = 2.0, 1, 16
    rec = record.Record("chatty_rank", args)
    limit = args.limit_mib << 20
    ratios, quiet, chatty, cpu = [], [], [], []
    last: dict = {}
    for i in range(args.rounds):
        order = (0.0, args.mbps) if i % 2 == 0 else (args.mbps, 0.0)
        got = {m: one(args.seconds, args.step_ms, m, args.terminal_mbps, limit) for m in order}
        quiet.append(got[0.0]["rate"])
        chatty.append(got[args.mbps]["rate"])
        ratios.append(chatty[-1] / quiet[-1])
        last = got[args.mbps]
        extra = last["launcher_cpu"] - got[0.0]["launcher_cpu"]
        cpu.append(extra / (last["written"] / 1e6) * 1e3)  # ms per MB
        first = "quiet first" if i % 2 == 0 else "chatty first"
        print(
            f"round {i + 1} ({first}): quiet {quiet[-1]:.2f} steps/s, writing "
            f"{last['written'] / args.seconds / 1e6:.1f} MB/s {chatty[-1]:.2f} steps/s: "
            f"ratio {ratios[-1]:.3f} (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
        rec.round(
            round=i + 1,
            order=first,
            quiet_steps_per_s=quiet[-1],
            chatty_steps_per_s=chatty[-1],
            chatty_written_mb_per_s=last["written"] / args.seconds / 1e6,
            ratio=ratios[-1],
            launcher_ms_per_mb=cpu[-1],
            load=os.getloadavg()[0],
        )
    ratio = statistics.median(ratios)
    print(
        f"{args.step_ms:g} ms steps for {args.seconds:g}s, {args.rounds} round(s): quiet "
        f"{statistics.median(quiet):.2f} steps/s, chatty ({args.mbps:g} MB/s) "
        f"{statistics.median(chatty):.2f} steps/s (medians); median paired ratio "
        f"{ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) (target >= 0.8: "
        f"{'met' if ratio >= 0.8 else 'not met'})"
    )
    print(
        f"the launcher's CPU time for the chatty rank's output: {statistics.median(cpu):.2f} "
        f"ms per MB (median), {statistics.median(cpu) * args.mbps / 10:.1f}% of a core at "
        f"{args.mbps:g} MB/s"
    )
    within = last["log"] <= limit
    print(
        f"last chatty run: wrote {last['written'] / 1e6:.0f} MB; its log "
        f"{last['log'] / 2**20:.1f} MiB, limit {args.limit_mib} MiB "
        f"({'within' if within else 'OVER'}); the {args.terminal_mbps:g} MB/s terminal got "
        f"{last['shown'] / 1e6:.1f} MB"
    )
    print(f"  {last['note'][:160]}")
    rec.figure(
        f"step rate of a rank writing {args.mbps:g} MB/s behind a "
        f"{args.terminal_mbps:g} MB/s terminal ({args.step_ms:g} ms steps)",
        statistics.median(chatty),
        "steps/s",
        spread=(min(chatty), max(chatty)),
        baseline=("the same rank, quiet", statistics.median(quiet)),
        ratio=ratio,
        ratio_spread=(min(ratios), max(ratios)),
        target=">= 0.8",
        met=ratio >= 0.8,
    )
    rec.figure(
        "the launcher's CPU time per MB the chatty rank wrote (beyond the quiet run's)",
        statistics.median(cpu),
        "ms/MB",
        spread=(min(cpu), max(cpu)),
    )
    rec.figure(
        "the chatty rank's archived log (last run)",
        last["log"] / 2**20,
        "MiB",
        target=f"<= {args.limit_mib} MiB (logLimitBytes)",
        met=within,
    )
    rec.figure("bytes the rank wrote (last run)", last["written"] / 1e6, "MB")
    rec.figure("bytes the slow terminal got (last run)", last["shown"] / 1e6, "MB")
    times = helper(args.terminal_mbps, limit)
    after = times["helper"] - times["node"]
    print(
        f"a helper in a session of its own, holding the rank's stdout: gone {after:+.2f}s "
        f"after the node's end (target <= 5 s: {'met' if after <= 5 else 'not met'}); the "
        f"node ended {times['node'] - times['rank']:.2f}s after its rank"
    )
    rec.figure(
        "a helper the rank started in a session of its own: gone, after the node's end",
        after,
        "s",
        target="<= 5 s",
        met=after <= 5,
    )
    rec.figure("the node's end, after its rank's", times["node"] - times["rank"], "s")
    rec.write()
    print(f"load average: {os.getloadavg()[0]:.2f} (other work on this machine adds noise)")


if __name__ == "__main__":
    main()

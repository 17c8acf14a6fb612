"""The test suite's own speed: ``make test`` and ``make check`` from a fresh clone, warm or cold.

Each round clones this repository's HEAD into a new folder and runs the target there as CI
does, every line of its output timestamped, and measures its wall time and CPU seconds
(its own and every process it waited for), how busy the whole machine was meanwhile (the
machine's busy CPU seconds, so that what other work did is not taken for the suite's),
and, from the clone's ``build/timings/`` (``tests/tiers.py``, ``tests/timing.py``), each
step's and each pytest run's wall time and CPU (the control planes, the real node and its
Pods included), the slowest test files and the shared fixtures' set-up (control planes,
the real node). From the log: what each Go tool, image and venv took to make.

- warm (the default): the caches as they are (``make setup`` first, untimed, so that a
  round measures a warm machine), ``--repeat`` rounds of ``make test`` and of ``make
  check`` (targets: 15 minutes and 3); results ``benchmarks/results/suite.json``;
- ``--cold``: every cache empty for each round (``TORCHYARD_CACHE``, Go's module and build
  caches and pip's in a new folder; the Debian packages the tests install stay installed),
  ``make test`` only (target: 45 minutes); results ``benchmarks/results/suite_cold.json``;
- ``--busy N``: N processes that keep a core busy run beside each round (a CPU-bound
  neighbour, as a local training run would be).

    .venv/bin/python benchmarks/suite.py [--repeat 3] [--cold] [--busy 1] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from benchmarks import record  # noqa: E402

TARGETS = {"test": 15 * 60, "check": 3 * 60, "cold test": 45 * 60}
SLOWEST_FILES = 20
# Lines of the log that say what making one thing took.
MADE = (
    re.compile(r"\[tools\] built (?P<what>.+?) in (?P<s>\d+)s"),
    re.compile(r"\[peers\] built (?P<what>.+?) in (?P<s>\d+)s"),
    re.compile(r"\[node\] step (?P<what>.+?): (?P<s>[\d.]+)s"),
    re.compile(r"\[node\] made (?P<what>\S+) .* in (?P<s>\d+)s"),
    re.compile(r"\[setup\] (?P<what>.+?): ready in (?P<s>\d+)s"),
    re.compile(r"\[cluster\] control plane up in (?P<s>[\d.]+)s"),
)


def busy_seconds() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def clone(into: Path) -> Path:
    target = into / "torchyard"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], check=True)
    return target


def cold_environment(scratch: Path) -> dict[str, str]:
    caches = scratch / "caches"
    return {
        "TORCHYARD_CACHE": str(caches / "torchyard"),
        "GOMODCACHE": str(caches / "go-mod"),
        "GOCACHE": str(caches / "go-build"),
        "PIP_CACHE_DIR": str(caches / "pip"),
        "npm_config_cache": str(caches / "npm"),
    }


def timed(target: str, where: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """``make <target>`` in ``where``: its exit code, wall time, CPU seconds, the machine's
    busy seconds and load average meanwhile, and the log's lines with their times."""
    lines: list[tuple[float, str]] = []
    load_before, busy_before = list(os.getloadavg()), busy_seconds()
    began = time.monotonic()
    proc = subprocess.Popen(
        ["make", target],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    with log.open("w") as out:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            at = time.monotonic() - began
            lines.append((at, line))
            out.write(f"{at:8.1f} {line}\n")
            out.flush()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - began
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "machine_busy_s": busy_seconds() - busy_before,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "lines": lines,
    }


def made(lines: list[tuple[float, str]]) -> dict[str, float]:
    """What making each Go tool, image, venv and control plane took, as the log says."""
    found: dict[str, float] = {}
    for _, line in lines:
        text = re.sub(r"^(\[[\w+-]+\] )+(?=\[)", "", line)  # the step's label in front
        for pattern in MADE:
            hit = pattern.search(text)
            if hit:
                what = hit.groupdict().get("what") or "control plane start"
                found[what] = found.get(what, 0.0) + float(hit["s"])
    return found


def steps(where: Path) -> dict[str, Any]:
    """The clone's ``build/timings``: every step, and per pytest run its files and fixtures."""
    folder = where / "build" / "timings"
    out: dict[str, Any] = {"steps": [], "runs": {}}
    with contextlib.suppress(OSError, ValueError, KeyError):
        out["steps"] = json.loads((folder / "steps.json").read_text())["steps"]
    for path in sorted(folder.glob("*.json")):
        if path.name != "steps.json":
            with contextlib.suppress(OSError, ValueError):
                out["runs"][path.stem] = json.loads(path.read_text())
    return out


def slowest_files(runs: dict[str, Any]) -> list[dict[str, Any]]:
    files = [
        {"run": run, "file": name, **figures}
        for run, data in runs.items()
        for name, figures in (data.get("files") or {}).items()
    ]
    return sorted(files, key=lambda f: -f["wall_s"])[:SLOWEST_FILES]


class Busy:
    """``count`` processes that keep a core busy each, for the ``with`` block."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Busy:
        loop = "while True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(self.count)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def one_round(name: str, target: str, scratch: Path, cold: bool, busy: int) -> dict[str, Any]:
    where = clone(scratch)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cold:
        env.update(cold_environment(scratch))
    print(f"[suite] {name}: make {target} in {where}", flush=True)
    with Busy(busy):
        result = timed(target, where, env, scratch / f"{target}.log")
    found = steps(where)
    entry: dict[str, Any] = {
        "what": name,
        "exit": result["exit"],
        "wall_s": round(result["wall_s"], 1),
        "cpu_s": round(result["cpu_s"], 1),
        "others_cpu_s": round(max(0.0, result["machine_busy_s"] - result["cpu_s"]), 1),
        "load_before": result["load_before"],
        "load_after": result["load_after"],
        "steps": {
            s["step"]: {"from_s": s["began_s"], "wall_s": s["wall_s"], "cpu_s": s["cpu_s"]}
            for s in found["steps"]
        },
        "made": made(result["lines"]),
        "fixtures": {
            run: {k: v for k, v in (data.get("fixtures") or {}).items() if v["wall_s"] >= 1}
            for run, data in found["runs"].items()
        },
        "slowest_files": slowest_files(found["runs"]),
    }
    print(
        f"[suite] {name}: exit {entry['exit']}, {entry['wall_s']:.0f} s, "
        f"CPU {entry['cpu_s']:.0f} s "
        f"(the machine's other work: {entry['others_cpu_s']:.0f} s), load {result['load_before']} "
        f"-> {result['load_after']}",
        flush=True,
    )
    for step, figures in entry["steps"].items():
        print(
            f"[suite]   {step:12s} from {figures['from_s']:6.0f} s  {figures['wall_s']:6.0f} s  "
            f"CPU {figures['cpu_s']:6.0f} s",
            flush=True,
        )
    return entry


def summary(rec: record.Record, name: str, entries: list[dict[str, Any]]) -> None:
    walls = [e["wall_s"] for e in entries if e["what"] == name]
    cpus = [e["cpu_s"] for e in entries if e["what"] == name]
    if not walls:
        return
    green = all(e["exit"] == 0 for e in entries if e["what"] == name)
    target = TARGETS[name]
    rec.figure(
        f"make {name}: wall time",
        statistics.median(walls),
        "s",
        spread=(min(walls), max(walls)),
        target=f"<= {target} s in every round, green",
        met=green and max(walls) <= target,
    )
    rec.figure(f"make {name}: CPU", statistics.median(cpus), "s", spread=(min(cpus), max(cpus)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each target")
    parser.add_argument("--cold", action="store_true", help="every cache empty in each round")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside it")
    parser.add_argument("--keep", action="store_true", help="keep each round's clone and log")
    parser.add_argument(
        "--targets", default="test,check", help="warm: which of test,check (default both)"
    )
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("suite_cold", args) if args.cold else record.Record("suite", args)
    plan = ["cold test"] if args.cold else [t for t in args.targets.split(",") if t]
    if not set(plan) <= set(TARGETS):
        parser.error(f"--targets takes test and check, not {args.targets}")
    if "test" in plan:
        print("[suite] make setup (untimed): the caches a warm round finds", flush=True)
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run(["make", "--no-print-directory", "setup"], cwd=REPO, env=env, check=True)
    entries: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for name in plan:  # interleaved: drift in the machine's load hits both alike
            scratch = Path(tempfile.mkdtemp(prefix="torchyard-suite-"))
            try:
                entry = one_round(name, name.split()[-1], scratch, args.cold, args.busy)
            finally:
                if args.keep:
                    print(f"[suite] kept {scratch}", flush=True)
                else:
                    shutil.rmtree(scratch, ignore_errors=True)
            entries.append({"round": i + 1, **entry})
            rec.round(
                round=i + 1,
                what=name,
                exit=entry["exit"],
                wall_s=entry["wall_s"],
                cpu_s=entry["cpu_s"],
                others_cpu_s=entry["others_cpu_s"],
                load=entry["load_before"][0],
                **{f"{s} wall_s": f["wall_s"] for s, f in entry["steps"].items()},
            )
    for name in plan:
        summary(rec, name, entries)
    rec.note(
        "Every round starts from a fresh clone; CPU is make's and every process it waited "
        "for; others_cpu_s is the machine's busy CPU seconds that were not the suite's."
    )
    if args.busy:
        rec.note(f"{args.busy} CPU-bound process(es) ran beside each round.")
    rec.settings["details"] = entries  # steps, what each build took, slowest files, fixtures
    rec.write()
    return 0 if all(e["exit"] == 0 for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The benchmarks' figures as data: one JSON file per benchmark, ``benchmarks/results/<name>.json``.

Every benchmark script makes a :class:`Record` when it starts (the time, the machine, its
load average, the command line), adds each round's figures (:meth:`Record.round`) and its
summary figures (:meth:`Record.figure`: value, unit, spread, the baseline measured in the
same run, the ratio and the target), and calls :meth:`Record.write` at the end, which
adds the load average at the end and the versions of Python, torch and the Kubernetes
client. The file of the newest run replaces the one before (git keeps the history);
``docs/gen/benchmarks.py`` makes the documentation's benchmarks page from these files, so
that no figure is typed by hand.

A ``--smoke`` run (the test suite's) writes no file unless ``--results FILE`` names one;
``--results -`` writes none.

    rec = record.Record("launch_overhead", args)
    rec.round(arm="torchyard", round=1, first_step_s=4.7, total_s=8.6)
    rec.figure("time to first step", 4.7, "s", spread=(4.6, 4.9),
               baseline=("torchrun --standalone", 5.4), ratio=0.87, target="<= 1.10", met=True)
    rec.write()   # benchmarks/results/launch_overhead.json

Standard library only, so that any benchmark (and a GPU machine's) can use it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCHEMA = 1


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--results FILE``: where the figures go (default ``benchmarks/results/<name>.json``,
    none for ``--smoke``; ``-``: none)."""
    parser.add_argument(
        "--results",
        metavar="FILE",
        default=None,
        help="write the figures as JSON to FILE (default: benchmarks/results/<name>.json; "
        "with --smoke: no file; '-': no file)",
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _first(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        pass
    return None


def _gpus() -> list[str]:
    """``name, memory, driver`` of each NVIDIA GPU nvidia-smi lists (none without it)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    memory = _first("/proc/meminfo", "MemTotal")
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor() or None,
        "memory_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "arch": platform.machine(),
        "kernel": platform.release(),
        "system": platform.system(),
    }
    gpus = _gpus()
    if gpus:
        facts["gpus"] = gpus
    return facts


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Python's, and the packages' the benchmarks run (None: not installed)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "kubernetes_client": _version("kubernetes"),
        "torchyard": _version("torchyard") or _source_version(),
    }


def _source_version() -> str | None:
    """torchyard's version when it runs from a source tree (PYTHONPATH=operator), not installed."""
    try:
        import torchyard
    except ImportError:
        return None
    return getattr(torchyard, "__version__", None)


def _git() -> dict[str, Any]:
    def run(*args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=HERE, capture_output=True, text=True, timeout=30, check=False
        )
        return out.stdout.strip()

    try:
        commit = run("rev-parse", "--short=12", "HEAD")
        dirty = bool(run("status", "--porcelain", "--untracked-files=no", "--", "operator"))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit or None, "operator_modified": dirty}


def _plain(value: Any) -> Any:
    """``value`` as JSON: tuples as lists, floats rounded to 6 significant digits."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


class Record:
    """The figures of one run of one benchmark."""

    def __init__(
        self, name: str, args: argparse.Namespace | None = None, *, command: str = ""
    ) -> None:
        self.name = name
        self.smoke = bool(getattr(args, "smoke", False))
        self.path: str | None = getattr(args, "results", None)
        script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else f"{name}.py"
        self.command = command or shlex.join(["python", f"benchmarks/{script}", *sys.argv[1:]])
        self.started = _now()
        self.load_start = _load()
        self.settings: dict[str, Any] = (
            {k: v for k, v in vars(args).items() if k != "results"} if args else {}
        )
        self.extra_versions: dict[str, str] = {}
        self.rounds: list[dict[str, Any]] = []
        self.figures: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def round(self, **figures: Any) -> None:
        """One round's (or one repetition's) figures, as the script printed them."""
        self.rounds.append(dict(figures))

    def figure(
        self,
        name: str,
        value: float | int | str,
        unit: str = "",
        *,
        spread: tuple[float, float] | None = None,
        baseline: tuple[str, float | int | str] | None = None,
        ratio: float | None = None,
        ratio_spread: tuple[float, float] | None = None,
        target: str | None = None,
        met: bool | None = None,
    ) -> None:
        """A summary figure: its value (a median, a count), with the baseline measured in
        the same run, torchyard's ratio to it and the target, where there are any."""
        entry: dict[str, Any] = {"name": name, "value": value, "unit": unit}
        if spread is not None:
            entry["spread"] = list(spread)
        if baseline is not None:
            entry["baseline"] = {"name": baseline[0], "value": baseline[1]}
        if ratio is not None:
            entry["ratio"] = ratio
        if ratio_spread is not None:
            entry["ratio_spread"] = list(ratio_spread)
        if target is not None:
            entry["target"] = target
        if met is not None:
            entry["met"] = met
        self.figures.append(entry)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def version(self, name: str, value: str) -> None:
        """A version beyond :func:`versions` (the control plane's, a peer's)."""
        self.extra_versions[name] = value

    def data(self) -> dict[str, Any]:
        return _plain(
            {
                "schema": SCHEMA,
                "benchmark": self.name,
                "command": self.command,
                "started": self.started,
                "finished": _now(),
                "machine": machine(),
                "load_average": {"start": self.load_start, "end": _load()},
                "versions": {**versions(), **self.extra_versions},
                "git": _git(),
                "settings": self.settings,
                "figures": self.figures,
                "rounds": self.rounds,
                "notes": self.notes,
            }
        )

    def target(self) -> Path | None:
        if self.path == "-" or (self.path is None and self.smoke):
            return None
        return Path(self.path) if self.path else RESULTS / f"{self.name}.json"

    def write(self) -> Path | None:
        """Write the file (see the module's docstring for where); its path, or None."""
        path = self.target()
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.data(), indent=2) + "\n")
        tmp.replace(path)
        print(f"figures written to {path}", flush=True)
        return path


def main(argv: Sequence[str] | None = None) -> int:
    """A results file from a shell script's figures: ``python benchmarks/record.py NAME
    FIGURES.tsv --command CMD [--started ISO] [--load-start L1,L5,L15] [--note TEXT]...``,
    one figure a line: ``name<TAB>value<TAB>unit[<TAB>target<TAB>met]`` (met: 1 or 0)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name")
    parser.add_argument("figures", type=Path)
    parser.add_argument("--command", required=True, help="the command that measured them")
    parser.add_argument("--started", help="when it started (ISO 8601; default: now)")
    parser.add_argument("--load-start", help="the load average when it started: L1,L5,L15")
    parser.add_argument("--note", action="append", default=[])
    add_argument(parser)
    args = parser.parse_args(argv)
    rec = Record(args.name, argparse.Namespace(results=args.results), command=args.command)
    if args.started:
        rec.started = args.started
    if args.load_start:
        rec.load_start = [float(x) for x in args.load_start.split(",")]
    for line in args.figures.read_text().splitlines():
        if not line.strip():
            continue
        name, value, unit, target, met = [*line.split("\t"), "", "", "", ""][:5]
        try:
            number: float | str = float(value)
        except ValueError:
            number = value
        rec.figure(
            name,
            number,
            unit,
            target=target or None,
            met={"1": True, "0": False}.get(met),
        )
    for note in args.note:
        rec.note(note)
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TensorBoard on a live run: how soon a scalar a rank writes shows in ``torchyard tensorboard``.

A local run (``torchyard run --local``) writes one scalar a second to
``$TORCHYARD_TENSORBOARD_DIR`` (the standard-library event writer of the tests,
``tests/tensorboards.py``). Two TensorBoards watch it side by side:

- torchyard: ``torchyard tensorboard RUN --local`` (it copies node 0's event folder into a
  folder of its own every ``--interval`` seconds and runs TensorBoard over that);
- the baseline: the same TensorBoard, with the same flags (``sdk.tensorboard.
  tensorboard_command``: reload every second, the pure-Python loader), started directly on
  node 0's event folder: what TensorBoard alone takes, with no copy.

Both are asked over their scalars API every 0.1 s. A step's latency is when it was first
seen minus the wall time its event carries (one clock: all on this machine); only steps
written after both served count. Target: p95 within 10 s; the ratio of the medians to the
baseline's is the copy's cost.

    .venv/bin/python benchmarks/tensorboard_live.py [--steps 40] [--interval 0.5] [--smoke]

Needs the pinned TensorBoard venv (``make tensorboard``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record  # noqa: E402
from tests import tensorboards  # noqa: E402
from tests.cluster.harness import free_port  # noqa: E402

from torchyard.sdk import tensorboard as tb  # noqa: E402

HOST = "127.0.0.1"
TARGET_S = 10.0


def points(url: str, run: str) -> list[tuple[float, int]]:
    """(wall time, step) of every ``loss`` scalar TensorBoard shows for ``run``."""
    query = urllib.parse.urlencode({"run": run, "tag": "loss"})
    try:
        with urllib.request.urlopen(f"{url}/data/plugin/scalars/scalars?{query}", timeout=5) as r:
            return [(float(p[0]), int(p[1])) for p in json.loads(r.read())]
    except (urllib.error.URLError, OSError, ValueError):  # not serving, or not loaded yet
        return []


def wait_for(what: str, check: object, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check() if callable(check) else None
        if got:
            return got
        time.sleep(0.1)
    raise SystemExit(f"tensorboard_live: no {what} within {timeout:.0f}s")


def start_run(tmp: Path, steps: int) -> tuple[subprocess.Popen[bytes], list[str]]:
    (tmp / "scalars.py").write_text(tensorboards.SCALARS_STDLIB)
    body = {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "scalars"},
        "spec": {"environment": "local", "command": [sys.executable, "scalars.py", str(steps)]},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(body))
    folders = ["--registry", str(tmp / "registry"), "--workdir", str(tmp / "work")]
    cmd = [sys.executable, "-m", "torchyard", "run", "run.yaml", "--local", *folders]
    log = (tmp / "run.log").open("wb")
    return subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT), folders


def serve_both(
    tmp: Path, binary: str, folders: list[str], interval: float
) -> tuple[subprocess.Popen[str], str, subprocess.Popen[bytes], str]:
    """torchyard tensorboard over the run, and TensorBoard alone on node 0's event folder."""
    events = wait_for(
        "event folder of node 0",
        lambda: sorted((tmp / "work").glob("default-scalars-*/node-0/outputs/tensorboard")),
        120,
    )
    assert isinstance(events, list)
    options = ["--folder", str(tmp / "kept"), "--tensorboard", binary, "--interval", str(interval)]
    ours = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchyard",
            "tensorboard",
            "scalars",
            "--local",
            *folders,
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=(tmp / "ours.log").open("wb"),  # what it says as it copies
        text=True,
        cwd=tmp,
    )
    assert ours.stdout is not None
    url = ""
    for line in ours.stdout:  # its first line on stdout says where it serves
        if "serving http://" in line:
            url = line.split("serving ", 1)[1].split()[0]
            break
    if not url:
        raise SystemExit(f"torchyard tensorboard did not serve: exit {ours.wait()}")
    port = free_port()
    alone = subprocess.Popen(
        tb.tensorboard_command(binary, events[0], port, HOST),
        stdout=(tmp / "alone.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    return ours, url, alone, f"http://{HOST}:{port}"


def watch(urls: dict[str, tuple[str, str]], steps: int) -> dict[str, dict[int, float]]:
    """Poll every TensorBoard until each showed ``steps`` steps written after all of them
    served (showed a first step); {arm: {step: latency in s}} of those steps."""
    seen: dict[str, dict[int, tuple[float, float]]] = {arm: {} for arm in urls}

    def poll() -> None:
        for arm, (url, run) in urls.items():
            now = time.time()
            for wall, step in points(url, run):
                seen[arm].setdefault(step, (wall, now))
        time.sleep(0.1)

    wait_for("first scalars in every TensorBoard", lambda: poll() or all(seen.values()), 300)
    served = time.time()

    def later(arm: str) -> dict[int, float]:
        return {step: now - wall for step, (wall, now) in seen[arm].items() if wall > served}

    wait_for(
        f"{steps} new steps in every TensorBoard",
        lambda: poll() or all(len(later(arm)) >= steps for arm in urls),
        steps + 120,
    )
    return {arm: later(arm) for arm in urls}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=40, help="scalars the run writes, one a second"
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, help="torchyard tensorboard's copy interval"
    )
    parser.add_argument("--smoke", action="store_true", help="5 steps")
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.steps = 5
    venv = tensorboards.venv()
    if not (venv / ".complete").exists():
        raise SystemExit(f"no TensorBoard at {venv}: run 'make tensorboard'")
    rec = record.Record("tensorboard_live", args)
    with tempfile.TemporaryDirectory(prefix="tb-live-") as name:
        tmp = Path(name)
        run, folders = start_run(tmp, 100_000)  # (stopped once measured: SIGTERM, as Ctrl-C)
        ours = alone = None
        try:
            ours, url, alone, alone_url = serve_both(
                tmp, str(venv / "bin" / "tensorboard"), folders, args.interval
            )
            urls = {
                "torchyard tensorboard": (url, "scalars"),
                "TensorBoard alone": (alone_url, "."),
            }
            latency = watch(urls, args.steps)
            # SIGTERM (SIGINT may be ignored: a shell starts background jobs so)
            run.send_signal(signal.SIGTERM)
            code = run.wait(120)
        finally:
            for proc in (ours, alone):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
            if run.poll() is None:
                run.kill()
        if code != 128 + signal.SIGTERM:  # stopped, as Ctrl-C stops a local run
            raise SystemExit(f"the run ended {code}:\n{(tmp / 'run.log').read_text()[-2000:]}")
    ours_s = list(latency["torchyard tensorboard"].values())
    base_s = list(latency["TensorBoard alone"].values())
    if not ours_s or not base_s:
        raise SystemExit(f"no step written after both served: {latency}")
    for step in sorted(latency["torchyard tensorboard"]):
        rec.round(step=step, **{arm: got.get(step) for arm, got in latency.items()})
    ratio = statistics.median(ours_s) / statistics.median(base_s)
    load = os.getloadavg()[0]
    print(f"tensorboard live: {len(ours_s)} steps written after both served, one a second; "
          f"copy interval {args.interval:g}s (load {load:.2f})")  # fmt: skip
    print(f"{'':28} {'median':>8} {'p95':>8} {'max':>8}")
    for arm, values in (("torchyard tensorboard", ours_s), ("TensorBoard alone", base_s)):
        print(f"{arm:28} {statistics.median(values):7.2f}s {p95(values):7.2f}s {max(values):7.2f}s")
    met = p95(ours_s) <= TARGET_S
    verdict = "met" if met else "not met"
    print(f"target: a new scalar shown within {TARGET_S:g} s, p95: {p95(ours_s):.2f}s "
          f"({verdict}; ratio of medians to TensorBoard alone {ratio:.2f})")  # fmt: skip
    rec.figure(
        "new scalar written -> shown by torchyard tensorboard (median)",
        statistics.median(ours_s),
        "s",
        spread=(min(ours_s), max(ours_s)),
        baseline=("TensorBoard alone on node 0's event folder", statistics.median(base_s)),
        ratio=ratio,
    )
    rec.figure(
        "new scalar written -> shown (p95)", p95(ours_s), "s", target=f"<= {TARGET_S:g} s", met=met
    )
    rec.write()


if __name__ == "__main__":
    main()

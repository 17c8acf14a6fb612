"""Scale: a queue of thousands of one-GPU TrainingRuns on the KWOK GPU pool (4 nodes x 8 GPUs).

Against the test control plane (tests/cluster/harness.py), the operator runs as a
subprocess (so that its CPU time and RSS are read from /proc), once built from this tree
and once from a baseline git revision (``git archive REV operator crds``, run with
PYTHONPATH pointing at it, after its own CRDs are applied), each on a fresh namespace
after the other's runs are gone. For each:
  - apply: N runs (one node, one GPU each) applied server-side, and the time until every
    run has a phase (32 Running, the rest Queued); the apiserver's requests meanwhile
    (its ``apiserver_request_total``, every client's), per run, by verb and resource;
  - refill: a Running run deleted (a freed GPU), and the time until the next gang's Pod is
    ungated, until that Pod is Running (the end point the peers' refill has,
    benchmarks/scale_peers.py), and until that run's status says Running;
  - status lag: from a Pod's phase becoming Running (KWOK's stages move it) to its run's
    status saying Running, p50 and p99 over every run that started;
  - idle: the operator's CPU (% of one core) over a window where nothing changes, with the
    queue full, and its RSS (now and peak);
  - restart: the operator stopped and started again, and the time until it has reconciled
    every run once (its reconcile count, from its /metrics, stops growing past N).
Every figure is printed for both, then the ratios (baseline / this tree).

    .venv/bin/python benchmarks/scale.py [--runs 1000] [--baseline 1cce3b7] [--refills 3]
        [--baseline-timeout 300]   # the baseline's waits: what it misses is said, not awaited
        [--tree DIR]   # measure another operator/ folder as "this tree"
        [--profile DIR]   # the operator under benchmarks/sampler.py: where time goes
        [--peers]   # and the same queue as TrainJobs and PyTorchJobs (scale_peers.py)
    .venv/bin/python benchmarks/scale.py --smoke   # 50 runs (tests run this); the
        # baseline's refill is left out (--baseline-refills 0: it takes ~40 s a refill)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from benchmarks import record  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from tests.cluster.binaries import KUBERNETES_VERSION  # noqa: E402
from tests.cluster.harness import DEFAULT_POOLS, Cluster, free_port  # noqa: E402

from torchyard import k8s  # noqa: E402

POOL = DEFAULT_POOLS[0]  # a100: 4 nodes x 8 GPUs
SLOTS = POOL.nodes * POOL.gpus
LABEL_RUN = "torchyard.dev/run"
TICK = os.sysconf("SC_CLK_TCK")


def run_body(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "environment": "pytorch",
            "command": ["python", "train.py"],
            "resources": {"gpusPerNode": 1, "cpu": "1"},
            "compute": {"pool": POOL.name},
        },
    }


@dataclass
class World:
    """What the watches saw, each first time stamped (time.monotonic())."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    phase: dict[str, str] = field(default_factory=dict)
    run_running_at: dict[str, float] = field(default_factory=dict)
    pod_ungated_at: dict[str, float] = field(default_factory=dict)
    pod_running_at: dict[str, float] = field(default_factory=dict)
    # The same two moments as the objects say them (second resolution): the run's Running
    # condition's lastTransitionTime and its Pod's container startedAt. These do not
    # depend on how soon this process's watches deliver (a busy benchmark lags behind).
    run_running_stamp: dict[str, str] = field(default_factory=dict)
    pod_running_stamp: dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.phase.pop(name, None)
                return
            phase = str((obj.get("status") or {}).get("phase") or "")
            if phase:
                self.phase[name] = phase
            if phase == "Running":
                self.run_running_at.setdefault(name, time.monotonic())
                for c in (obj.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "Running" and c.get("status") == "True":
                        self.run_running_stamp.setdefault(name, c.get("lastTransitionTime", ""))

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        run = (obj["metadata"].get("labels") or {}).get(LABEL_RUN)
        if not run or kind == "DELETED":
            return
        now = time.monotonic()
        with self.lock:
            if not (obj.get("spec") or {}).get("schedulingGates"):
                self.pod_ungated_at.setdefault(run, now)
            if (obj.get("status") or {}).get("phase") == "Running":
                self.pod_running_at.setdefault(run, now)
                for c in (obj.get("status") or {}).get("containerStatuses") or []:
                    started = ((c.get("state") or {}).get("running") or {}).get("startedAt")
                    if started:
                        self.pod_running_stamp.setdefault(run, str(started))

    def count(self, phase: str | None = None) -> int:
        with self.lock:
            return sum(1 for p in self.phase.values() if phase is None or p == phase)


def watch_forever(world: World, list_fn: Any, on_event: Any, *args: Any, **kwargs: Any) -> None:
    """Feed ``on_event`` from a list, then its watch, until ``world.stop`` (listing again
    only when the watch fails, e.g. expired)."""
    while not world.stop.is_set():
        try:
            listed = list_fn(*args, **kwargs)
            if isinstance(listed, dict):  # custom objects: plain JSON
                items, rv = listed["items"], listed["metadata"]["resourceVersion"]
            else:
                items = [_raw(i) for i in listed.to_dict()["items"]]
                rv = listed.metadata.resource_version
            for item in items:
                on_event("ADDED", item)
            while not world.stop.is_set():
                w = watch.Watch()
                for event in w.stream(
                    list_fn, *args, resource_version=rv, timeout_seconds=30, **kwargs
                ):
                    obj = event["raw_object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(str(obj))
                    rv = obj["metadata"]["resourceVersion"]
                    on_event(event["type"], obj)
                    if world.stop.is_set():
                        w.stop()
        except Exception:  # an expired watch (410) or a busy apiserver: list again
            time.sleep(0.5)


def _raw(item: dict[str, Any]) -> dict[str, Any]:
    """A Pod from the typed client's to_dict(), with the wire's field names we read."""
    spec = item.get("spec") or {}
    return {
        "metadata": item["metadata"],
        "spec": {"schedulingGates": spec.get("scheduling_gates")},
        "status": item.get("status") or {},
    }


def start_watches(world: World, ns: str) -> None:
    api = k8s.load()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    runs = (
        custom.list_namespaced_custom_object,
        world.run_event,
        "torchyard.dev",
        "v1alpha1",
        ns,
        "trainingruns",
    )
    threading.Thread(target=watch_forever, args=(world, *runs), daemon=True).start()
    threading.Thread(
        target=watch_forever,
        args=(world, core.list_namespaced_pod, world.pod_event, ns),
        kwargs={"label_selector": LABEL_RUN},
        daemon=True,
    ).start()


def wait(what: str, check: Any, timeout: float) -> float | None:
    """Seconds until ``check()`` holds, or None past ``timeout`` (said, not fatal)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            print(f"  ({what}: not within {timeout:.0f}s)", flush=True)
            return None
        time.sleep(0.05)
    return time.monotonic() - started


class Operator:
    """The operator as a subprocess from ``pythonpath``, with its /metrics on a free port."""

    def __init__(
        self,
        pythonpath: str,
        kubeconfig: Path,
        log: Path,
        profile: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.pythonpath, self.kubeconfig, self.log = pythonpath, kubeconfig, log
        self.args = args  # the controller's command-line arguments (--namespace NS)
        self.profile = profile  # where benchmarks/sampler.py writes its counts, if at all
        self.starts = 0
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=self.pythonpath,
            KUBECONFIG=str(self.kubeconfig),
            TORCHYARD_RESOLVE_CURATED="127.0.0.1",
            TORCHYARD_METRICS_PORT=str(self.port),
        )
        self.started = time.monotonic()
        self.starts += 1
        command = [sys.executable, "-m", "torchyard.controller", *self.args]
        if self.profile is not None:
            out_file = f"{self.profile}-{self.starts}.txt"
            command[1:1] = [str(REPO / "benchmarks" / "sampler.py"), out_file]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait("operator /metrics", lambda: self.reconciles() is not None, 60) is None:
            self.fail("did not start")

    def fail(self, what: str) -> None:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        self.stop()
        raise SystemExit(f"the operator ({self.pythonpath}) {what}:\n{tail}")

    def reconciles(self) -> int | None:
        """TrainingRun reconciles so far (its /metrics), None while it does not answer."""
        if self.proc is not None and self.proc.poll() is not None:
            self.fail(f"exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        found = re.search(
            r'^torchyard_reconcile_duration_seconds_count\{kind="TrainingRun"\} (\S+)', text, re.M
        )
        return int(float(found.group(1))) if found else 0

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime

    def memory_mib(self) -> tuple[float, float]:
        """RSS now and its peak (VmHWM), in MiB."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        peak = re.search(r"^VmHWM:\s+(\d+)", status, re.M)
        return (
            int(rss.group(1)) / 1024 if rss else 0.0,
            int(peak.group(1)) / 1024 if peak else 0.0,
        )

    def cut(self) -> None:
        """End a window of the sampled profile (--profile), if there is one."""
        if self.profile is not None and self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def apiserver_requests() -> collections.Counter[str]:
    """The apiserver's ``apiserver_request_total`` (its /metrics), summed by verb and
    resource (``POST pods``, ``PATCH trainingruns/status`` ...): every client's requests."""
    api = k8s.load()
    method, url, headers, _, _ = api.param_serialize(
        method="GET",
        resource_path="/metrics",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )
    text = api.call_api(method, url, header_params=headers).read().decode()
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        what = labels.get("resource", "") + (
            "/" + labels["subresource"] if labels.get("subresource") else ""
        )
        counts[f"{labels.get('verb', '?')} {what}"] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def print_requests(label: str, n: int, before: collections.Counter[str]) -> float:
    """The apiserver requests since ``before``, per run, busiest first; their sum per run
    less the benchmark's own apply of each run."""
    delta = apiserver_requests()
    delta.subtract(before)
    rows = [(k, v) for k, v in delta.most_common() if v > 0 and not k.startswith("WATCH")]
    print(f"[{label}] apiserver requests per run until all phased (every client):", flush=True)
    for what, count in rows[:12]:
        print(f"    {what:36s} {count / n:6.2f}", flush=True)
    return (sum(v for _, v in rows) - n) / n  # less the benchmark's own apply of each run


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def measure(
    label: str,
    pythonpath: str,
    cluster: Cluster,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, float | None]:
    """Every figure for one operator build, on a namespace of its own."""
    ns = cluster.create_namespace(f"scale-{label}")
    k8s.create(
        {
            "apiVersion": "torchyard.dev/v1alpha1",
            "kind": "Environment",
            "metadata": {"name": "pytorch", "namespace": ns},
            "spec": {"image": "img"},
        }
    )
    world = World()
    start_watches(world, ns)
    profile = args.profile / f"profile-{label}" if args.profile else None
    logs = args.profile or workdir
    op = Operator(pythonpath, cluster.kubeconfig, logs / f"operator-{label}.log", profile)
    op.start()
    figures: dict[str, float | None] = {}
    n, running_wanted = args.runs, min(args.runs, SLOTS)
    # The baseline's waits are bounded more tightly (it may never get there: said, not
    # waited for), so that a whole invocation stays within minutes.
    limit = args.timeout if label == "tree" else min(args.timeout, args.baseline_timeout)
    try:
        print(f"[{label}] applying {n} runs", flush=True)
        cpu_at_start, reconciles_at_start = op.cpu_seconds(), op.reconciles() or 0
        requests_before = apiserver_requests()
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: k8s.apply(run_body(ns, f"r{i:05d}"), field_manager="scale-bench"),
                    range(n),
                )
            )
        figures["apply"] = time.monotonic() - started
        phased = wait("every run has a phase", lambda: world.count() >= n, limit)
        figures["phased"] = None if phased is None else time.monotonic() - started
        wait(
            f"{running_wanted} Running",
            lambda: world.count("Running") >= running_wanted,
            limit,
        )
        op.cut()  # profile window 1: applying until all phased
        figures["apply_cpu"] = op.cpu_seconds() - cpu_at_start
        figures["reconciles_per_run"] = ((op.reconciles() or 0) - reconciles_at_start) / n
        figures["requests_per_run"] = print_requests(label, n, requests_before)
        print(f"[{label}] all phased; idle for {args.idle:.0f}s", flush=True)
        time.sleep(2)
        cpu0, t0 = op.cpu_seconds(), time.monotonic()
        time.sleep(args.idle)
        figures["idle_cpu"] = 100 * (op.cpu_seconds() - cpu0) / (time.monotonic() - t0)
        figures["rss"], figures["rss_peak"] = op.memory_mib()
        op.cut()  # profile window 2: idle
        ungated, pod_running, running = [], [], []
        refills = args.refills if label == "tree" else args.baseline_refills
        for i in range(refills if n > SLOTS else 0):
            with world.lock:
                victim = min(r for r, p in world.phase.items() if p == "Running")
                before = set(world.pod_ungated_at)
            freed = time.monotonic()
            k8s.delete(k8s.TRAININGRUNS, ns, victim)

            def next_gang(before: set[str] = before) -> str | None:
                with world.lock:
                    fresh = [r for r in world.pod_ungated_at if r not in before]
                return fresh[0] if fresh else None

            took = wait("next gang ungated", lambda: next_gang() is not None, args.refill_timeout)
            if took is None:  # the next won't come either: no more waiting for refills
                ungated.append(float("inf"))
                pod_running.append(float("inf"))
                running.append(float("inf"))
                break
            nxt = next_gang()
            assert nxt is not None
            ungated.append(world.pod_ungated_at[nxt] - freed)
            ok = wait(
                f"{nxt} Running", lambda nxt=nxt: nxt in world.run_running_at, args.refill_timeout
            )
            running.append(float("inf") if ok is None else world.run_running_at[nxt] - freed)
            # The end point the peers' refill has: the next run's Pod Running (the two
            # watches deliver in their own order, so it may come after the status).
            pod_ok = wait(
                f"{nxt}'s Pod Running",
                lambda nxt=nxt: nxt in world.pod_running_at,
                args.refill_timeout,
            )
            pod_running.append(
                float("inf") if pod_ok is None else world.pod_running_at[nxt] - freed
            )
            print(
                f"[{label}] refill {i + 1}: {nxt} ungated {ungated[-1]:.2f}s, "
                f"its Pod Running {pod_running[-1]:.2f}s, its status Running {running[-1]:.2f}s",
                flush=True,
            )
        op.cut()  # profile window 3: refills
        figures["refill_ungated"] = statistics.median(ungated) if ungated else None
        figures["refill_pod_running"] = statistics.median(pod_running) if pod_running else None
        figures["refill_running"] = statistics.median(running) if running else None
        with world.lock:
            lags = [
                world.run_running_at[r] - world.pod_running_at[r]
                for r in world.run_running_at
                if r in world.pod_running_at
            ]
            worst = sorted(
                (world.run_running_at[r] - world.pod_running_at[r], r)
                for r in world.run_running_at
                if r in world.pod_running_at
            )[-3:]
        print(
            f"[{label}] slowest status lags: "
            + ", ".join(
                f"{r} {lag:.2f}s (its Pod Running {world.pod_running_at[r] - started:.1f}s "
                f"after the first apply; as the objects say it: Pod started "
                f"{world.pod_running_stamp.get(r, '?')}, run Running "
                f"{world.run_running_stamp.get(r, '?')})"
                for lag, r in reversed(worst)
            ),
            flush=True,
        )
        figures["lag_p50"] = percentile(lags, 0.5) if lags else None
        figures["lag_p99"] = percentile(lags, 0.99) if lags else None
        figures["lag_n"] = len(lags)
        so_far = ", ".join(f"{k} {show(v, '')}" for k, v in figures.items() if k != "lag_n")
        print(f"[{label}] {so_far}; restarting the operator", flush=True)
        op.stop()
        op.start()
        figures["restart"] = resync_time(op, world.count(), limit)
    finally:
        op.stop()
        world.stop.set()
        cleanup(cluster, ns)
    return figures


def resync_time(op: Operator, runs: int, timeout: float) -> float | None:
    """From the restarted operator's start until it reconciled every run once and its
    reconcile count then stayed put for 3 s: the time of its last reconcile."""
    last, last_at = 0, op.started
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = op.reconciles() or 0
        now = time.monotonic()
        if count != last:
            last, last_at = count, now
        elif count >= runs and now - last_at >= 3:
            return last_at - op.started
        time.sleep(0.1)
    print(f"  (restart resync: {last} of {runs} reconciles within {timeout:.0f}s)", flush=True)
    return None


def cleanup(cluster: Cluster, ns: str) -> None:
    """Delete the namespace; wait until its Pods are gone (they hold the pool's GPUs)."""
    cluster.delete_namespace(ns)
    wait(
        f"Pods of {ns} gone",
        lambda: not k8s.list_(k8s.PODS, ns, label_selector=LABEL_RUN),
        600,
    )


def baseline_tree(rev: str, into: Path) -> str:
    """``operator/`` and ``crds/`` of ``rev`` unpacked under ``into``; the PYTHONPATH that
    runs it."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise SystemExit(
            f"--baseline {rev}: no such commit in {REPO} (fetch it, or name another revision)"
        )
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", found.stdout.strip(), "operator", "crds"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return str(into / "operator")


def show(value: float | None, unit: str, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "never"
    return fmt.format(value) + unit


ROWS = [
    ("apply", "apply (server-side, 16 at a time)", "s"),
    ("phased", "every run has a phase", "s"),
    ("apply_cpu", "operator CPU until all phased", "s"),
    ("reconciles_per_run", "reconciles per run until then", ""),
    ("requests_per_run", "apiserver requests per run until then", ""),
    ("refill_ungated", "freed slot -> next gang ungated", "s"),
    ("refill_pod_running", "freed slot -> next run's Pod Running", "s"),
    ("refill_running", "freed slot -> its status Running", "s"),
    ("lag_p50", "status lag p50", "s"),
    ("lag_p99", "status lag p99", "s"),
    ("idle_cpu", "idle CPU, queue full (% of a core)", "%"),
    ("rss", "RSS (MiB)", ""),
    ("rss_peak", "RSS peak (MiB)", ""),
    ("restart", "restarted operator resynced", "s"),
]


def report(
    n: int,
    rev: str,
    mine: dict[str, float | None],
    base: dict[str, float | None],
    rec: record.Record | None = None,
) -> None:
    print(f"\nscale: {n} runs, 1 node x 1 GPU each, pool {POOL.name} ({SLOTS} GPUs)")
    print(f"status lag samples: this tree {mine['lag_n']}, baseline {base.get('lag_n')}")
    print(f"{'figure':38s} {'this tree':>12s} {'baseline ' + rev:>18s} {'ratio':>8s}")
    for key, title, unit in ROWS:
        a, b = mine.get(key), base.get(key)
        ratio = "n/a"
        if a is not None and b is not None and a not in (0, float("inf")):
            ratio = "inf" if b == float("inf") else f"{b / a:.1f}x"
        print(f"{title:38s} {show(a, unit):>12s} {show(b, unit):>18s} {ratio:>8s}")
        if rec is not None and a is not None:
            rec.figure(
                f"{n} runs: {title}",
                a,
                unit,
                baseline=(f"revision {rev}", b if b is not None else "n/a") if base else None,
                ratio=a / b if b not in (None, 0, float("inf")) and a is not None else None,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--baseline", default="1cce3b7", help="git revision to compare with ('none': skip it)"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=REPO / "operator",
        help="the operator/ folder measured as this tree (default: this checkout's)",
    )
    parser.add_argument("--refills", type=int, default=3, help="freed slots to time")
    parser.add_argument(
        "--baseline-refills",
        type=int,
        help="freed slots to time on the baseline (default: --refills; --smoke: 0, as the "
        "baseline takes ~40 s a refill)",
    )
    parser.add_argument("--idle", type=float, default=30.0, help="idle CPU window (s)")
    parser.add_argument("--timeout", type=float, default=900.0, help="limit per wait (s)")
    parser.add_argument("--refill-timeout", type=float, default=60.0)
    parser.add_argument(
        "--baseline-timeout",
        type=float,
        default=300.0,
        help="limit per wait of the baseline (s): what it does not reach by then is 'n/a'",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="50 runs, 1 refill (none of the baseline's), 5 s idle",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="the same queue as TrainJobs and PyTorchJobs (benchmarks/scale_peers.py)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder for the operator's sampled profile (benchmarks/sampler.py) and its log",
    )
    record.add_argument(parser)
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.refills, args.idle, args.refill_timeout = 50, 1, 5.0, 75.0
        if args.baseline_refills is None:
            args.baseline_refills = 0
    if args.baseline_refills is None:
        args.baseline_refills = args.refills
    if args.runs < 1 or min(args.refills, args.baseline_refills) < 0 or args.idle <= 0:
        parser.error("--runs must be >= 1, --refills and --baseline-refills >= 0, --idle > 0")
    if not (args.tree / "torchyard" / "controller").is_dir():
        parser.error(f"--tree {args.tree}: not an operator/ folder (no torchyard/controller)")
    rec = record.Record("scale", args)
    rec.version("kubernetes", KUBERNETES_VERSION)
    with tempfile.TemporaryDirectory(prefix="torchyard-scale-") as tmp:
        work = Path(tmp)
        base_path = "" if args.baseline == "none" else baseline_tree(args.baseline, work)
        with Cluster(pools=(POOL,)) as cluster:
            os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
            k8s.reset()
            mine = measure("tree", str(args.tree.resolve()), cluster, args, work)
            base = {}
            if base_path:
                # The baseline's own CRDs: this tree's add defaulted fields that an older
                # operator's strict models refuse (every run Failed, "Extra inputs").
                cluster.kubectl(
                    "apply", "--server-side", "--force-conflicts", "-f", str(work / "crds")
                )
                base = measure("base", base_path, cluster, args, work)
            if args.peers:
                from benchmarks import scale_peers

                theirs = scale_peers.measure(cluster, args)
    report(args.runs, args.baseline, mine, base, rec)
    if args.peers:
        scale_peers.report(args.runs, mine, theirs, rec)
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())

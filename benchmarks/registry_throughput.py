"""Registry service throughput: a 1 GiB file up and down, against a fair floor.

Runs the service (``torchyard.registry.service``) in a child process on loopback with an
authorizer that allows every request (this measures streaming, not TokenReview), uploads
a 1 GiB file with the launcher as a run's node Pod does (sha256 computed on both sides,
confirmed before the file becomes visible), downloads it back with the SDK (sha256
verified, fsynced), and compares both speeds with two references measured on the same
file in the same run, rounds interleaved:

- the **hashed floor**: the same bytes copied *and* sha256-hashed locally, the fastest of
  three methods (per round), each using both cores: ``tee dst < src | sha256sum`` and
  ``tee dst < src | openssl dgst -sha256`` (tee copies, the other process hashes; OpenSSL
  uses the CPU's SHA instructions) and Python with the write in a thread overlapping the
  hash (hashlib and os.write release the GIL); fsynced. The registry must hash every byte, so
  this is what it can at best reach. Target: upload and download >= 0.8 of it.
- the **checked floor**, for the upload: the same bytes copied and sha256-hashed *twice*,
  once as read (a hasher reading the file) and once as written (``tee dst | hasher``),
  three processes at once on both cores: the work of an upload checked end to end (the
  launcher hashes what it sends, the service what it receives). The target stays
  against the hashed floor; this says how much of the gap is the second hash.
- the **plain copy**: ``shutil.copyfile`` + fsync (in-kernel, no hash), for scale.

Each figure also says what it costs in CPU (core-seconds per GiB: this process, its
children and the service), which the machine's load does not change the way it changes
the wall time, and what the service alone costs (in a cluster the launcher or the SDK runs
on another machine, so the registry's machine pays only that) against what the floor
costs in all. The download's CPU per GiB in all is compared with the hashed floor's
(target: no more), the upload's with the checked floor's; every round records its CPU
per GiB beside its speeds. Prints the service's peak memory (VmHWM), which must stay
flat in the file size, and the load average before and after.

    .venv/bin/python benchmarks/registry_throughput.py [--mib 1024] [--repeat 3]
    .venv/bin/python benchmarks/registry_throughput.py --smoke   # 8 MiB, once (tests run this)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
import record

from torchyard.launch.node_files import upload_file
from torchyard.sdk import RegistryClient

SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from aiohttp import web
    from torchyard.registry import Store, service

    class AllowAll:
        # Every token is the node Pods' ServiceAccount of the one run "r" in "bench".
        def user(self, token):
            return {"username": "system:serviceaccount:bench:default"}
        def allowed(self, user, verb, namespace, resource="modelversions"):
            return True
        def training_run(self, namespace, name):
            return service.RunIdentity("bench-run-uid", "default")

    web.run_app(service.create_app(Store(Path(sys.argv[1])), AllowAll()),
                host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
    """
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by this process, its waited-for children and process ``pid``."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    theirs = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + theirs


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` alone (the service)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


FLOOR_TARGET = 0.8
# The download costs no more CPU per GiB than the hashed floor (the floor's / the download's).
CPU_TARGET = 1.0
BLOCK = 4 << 20


def verdict(ratio: float) -> str:
    return "target met" if ratio >= FLOOR_TARGET else "TARGET MISSED"


def fsync_path(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def plain_copy(src: Path, dst: Path) -> None:
    """The in-kernel copy (copy_file_range/sendfile), fsynced: no byte reaches user space."""
    shutil.copyfile(src, dst)
    fsync_path(dst)


def hashed_copy_tee(src: Path, dst: Path, hasher: list[str]) -> str:
    """``tee dst < src | <hasher>``: one process copies, another hashes, fsynced."""
    with src.open("rb") as stdin:
        tee = subprocess.Popen(["tee", str(dst)], stdin=stdin, stdout=subprocess.PIPE)
        assert tee.stdout is not None
        done = subprocess.run(hasher, stdin=tee.stdout, capture_output=True, check=True)
        tee.stdout.close()
        if tee.wait() != 0:
            raise RuntimeError("tee failed")
    fsync_path(dst)
    return done.stdout.split()[0].decode()


def hashed_copy_threads(src: Path, dst: Path) -> str:
    """Python, both cores: each block is written by a thread while this one hashes it
    (os.write and hashlib both release the GIL), the next read overlapping both; fsynced."""
    digest = hashlib.sha256()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with ThreadPoolExecutor(1) as writer, src.open("rb", buffering=0) as f:
            pending = None
            while block := f.read(BLOCK):
                if pending is not None:
                    pending.result()
                pending = writer.submit(os.write, fd, block)
                digest.update(block)
            if pending is not None:
                pending.result()
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest.hexdigest()


def checked_copy_tee(src: Path, dst: Path, hasher: list[str]) -> str:
    """``<hasher> src & tee dst < src | <hasher>``: the bytes hashed as read (by a process
    reading the file itself, as the launcher's hashing thread does beside its send) and
    again as written (``tee`` copies, another process hashes), all at once; fsynced. Both
    digests must agree (the one returned)."""
    sent = subprocess.Popen([*hasher, str(src)], stdout=subprocess.PIPE)
    received = hashed_copy_tee(src, dst, hasher)
    one = sent.communicate()[0].split()[0].decode()
    if sent.returncode != 0:
        raise RuntimeError("the checked copy's first hasher failed")
    if one != received:
        raise RuntimeError(f"checked copy: {one} as read, {received} as written")
    return received


CHECKED_COPIES: dict[str, Callable[[Path, Path], str]] = {
    "tee|sha256 x2": lambda src, dst: checked_copy_tee(src, dst, ["sha256sum"]),
    "tee|openssl x2": lambda src, dst: checked_copy_tee(
        src, dst, ["openssl", "dgst", "-sha256", "-r"]
    ),
}
HASHED_COPIES: dict[str, Callable[[Path, Path], str]] = {
    "tee|sha256sum": lambda src, dst: hashed_copy_tee(src, dst, ["sha256sum"]),
    "tee|openssl": lambda src, dst: hashed_copy_tee(src, dst, ["openssl", "dgst", "-sha256", "-r"]),
    "two threads": hashed_copy_threads,
}
if shutil.which("openssl") is None:  # not in every image: the others still count
    del HASHED_COPIES["tee|openssl"]
    del CHECKED_COPIES["tee|openssl x2"]


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the median is shown)")
    parser.add_argument("--smoke", action="store_true", help="8 MiB, one round")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("registry_throughput", args)
    if args.smoke:
        args.mib, args.repeat = 8, 1
    size = args.mib << 20
    print(f"load average before:        {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        src = work / "model.bin"
        block = os.urandom(1 << 20)
        digest = hashlib.sha256()
        with src.open("wb") as f:
            for _ in range(args.mib):
                f.write(block)
                digest.update(block)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(work / "root"), str(port)])
        try:
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").close()
                    break
                except OSError:
                    time.sleep(0.05)
            base = f"http://127.0.0.1:{port}/v1/namespaces/bench/runs/r/outputs"
            stored = work / "root" / "bench" / "runs" / "r" / "outputs"

            client = RegistryClient(f"http://127.0.0.1:{port}", "x")
            walls: dict[str, list[float]] = {}
            cpus: dict[str, list[float]] = {}
            service_cpus: dict[str, list[float]] = {}

            def timed(key: str, action: Callable[[], object]) -> None:
                """Wall seconds, and CPU seconds of this process, its children and the
                service (load-independent: what the path costs, not what it got), and of
                the service alone."""
                service_before = process_cpu_seconds(proc.pid)
                before, started = cpu_seconds(proc.pid), time.monotonic()
                action()
                walls.setdefault(key, []).append(time.monotonic() - started)
                cpus.setdefault(key, []).append(cpu_seconds(proc.pid) - before)
                service_cpus.setdefault(key, []).append(
                    process_cpu_seconds(proc.pid) - service_before
                )

            out = work / "copy.bin"
            for i in range(args.repeat):  # interleaved, so drift hits every figure alike
                timed("plain copy", lambda: plain_copy(src, out))
                out.unlink()
                for name, method in {**HASHED_COPIES, **CHECKED_COPIES}.items():
                    got: list[str] = []
                    timed(name, functools.partial(lambda m, g: g.append(m(src, out)), method, got))
                    out.unlink()
                    if got != [digest.hexdigest()]:
                        raise RuntimeError(f"{name}: wrong sha256 {got}")
                # The launcher's own upload: one pass, hashed while sent, the service's
                # sha256 confirmed before the file becomes visible.
                # A new name each round, as a run's file: renaming over the last round's
                # would free its 1 GiB inside the timed request (the copies above remove
                # theirs after their clocks stopped, and so does this round, below).
                name = f"model-{i}.bin"
                timed("upload", functools.partial(upload_file, f"{base}/{name}", str(src), "x"))
                # The SDK's download: streamed, sha256-checked, fsynced, renamed into place.
                timed(
                    "download",
                    functools.partial(
                        client.download_run_file,
                        "bench",
                        "r",
                        f"outputs/{name}",
                        work / "down.bin",
                        digest.hexdigest(),
                    ),
                )
                (work / "down.bin").unlink()
                (stored / name).unlink()
            peak = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    mb = size / 1e6
    gib = size / (1 << 30)
    copies, ups, downs = walls["plain copy"], walls["upload"], walls["download"]
    # The floor of each round: the fastest hashed copy of that round.
    floors = [min(times) for times in zip(*(walls[n] for n in HASHED_COPIES), strict=True)]
    checked = [min(times) for times in zip(*(walls[n] for n in CHECKED_COPIES), strict=True)]
    copy_s, floor_s, up_s, down_s = (statistics.median(x) for x in (copies, floors, ups, downs))
    checked_s = statistics.median(checked)

    def cost(key: str) -> str:
        return f"cpu {statistics.median(cpus[key]) / gib:5.2f} core-s/GiB"

    print(f"file: {args.mib} MiB, median of {args.repeat} interleaved rounds")
    print(f"plain copy (reference):     {mb / copy_s:8.1f} MB/s   {cost('plain copy')}")
    for name in {**HASHED_COPIES, **CHECKED_COPIES}:
        print(
            f"hashed copy, {name + ':':<15}{mb / statistics.median(walls[name]):8.1f} MB/s   "
            f"{cost(name)}"
        )
    print(f"hashed floor (the fastest): {mb / floor_s:8.1f} MB/s   (copy + sha256, fsync)")
    print(f"checked floor (the fastest):{mb / checked_s:8.1f} MB/s   (copy + sha256 x2, fsync)")
    for name, times, median in (("upload", ups, up_s), ("download", downs, down_s)):
        vs_floor = [f / t for f, t in zip(floors, times, strict=True)]
        vs_copy = [c / t for c, t in zip(copies, times, strict=True)]
        print(
            f"{name + ':':<27} {mb / median:8.1f} MB/s   "
            f"ratio to floor {floor_s / median:5.2f} (rounds {span(vs_floor)}; "
            f"target >= {FLOOR_TARGET}: {verdict(floor_s / median)})   "
            f"ratio to plain copy {copy_s / median:5.2f} (rounds {span(vs_copy)})   {cost(name)}"
        )
    vs_checked = [c / t for c, t in zip(checked, ups, strict=True)]
    print(
        f"{'upload, checked floor:':<27} ratio {checked_s / up_s:5.2f} "
        f"(rounds {span(vs_checked)}): against the same work, sha256 as sent and as received"
    )
    # The same comparison in CPU per GiB, which the machine's load changes far less than
    # the wall time: the floor's (its cheapest method) against the download's in all (the
    # SDK and the service), and the checked floor's against the upload's (both hash twice).
    floor_cpu = min(statistics.median(cpus[n]) for n in HASHED_COPIES) / gib
    checked_cpu = min(statistics.median(cpus[n]) for n in CHECKED_COPIES) / gib
    cpu_ratios = {
        "download": floor_cpu / (statistics.median(cpus["download"]) / gib),
        "upload": checked_cpu / (statistics.median(cpus["upload"]) / gib),
    }
    print(
        f"{'download, cpu:':<27} ratio {cpu_ratios['download']:5.2f}: the hashed floor's "
        f"{floor_cpu:.2f} core-s/GiB / the download's in all (target >= {CPU_TARGET}: "
        f"{'met' if cpu_ratios['download'] >= CPU_TARGET else 'MISSED'})"
    )
    print(
        f"{'upload, cpu:':<27} ratio {cpu_ratios['upload']:5.2f}: the checked floor's "
        f"{checked_cpu:.2f} core-s/GiB / the upload's in all"
    )
    # In a cluster the launcher (or the SDK) runs on another machine than the service:
    # what the registry's own machine pays per GiB, against what the floor pays in all.
    for name in ("upload", "download"):
        service = statistics.median(service_cpus[name]) / gib
        print(
            f"{name + ', service alone:':<27} cpu {service:5.2f} core-s/GiB   "
            f"the floor's cpu / the service's {floor_cpu / service if service else 0:5.2f}   "
            f"the client's {statistics.median(cpus[name]) / gib - service:5.2f} core-s/GiB"
        )
    print(f"service peak memory:        {peak:8.1f} MiB (flat in the file size)")

    def fastest(i: int) -> str:
        """The floor's method of round ``i``: the fastest (its CPU is the round's floor's)."""
        return min(HASHED_COPIES, key=lambda name: walls[name][i])

    for i in range(args.repeat):
        rec.round(
            round=i + 1,
            plain_copy_mb_s=mb / copies[i],
            hashed_floor_mb_s=mb / floors[i],
            checked_floor_mb_s=mb / checked[i],
            upload_mb_s=mb / ups[i],
            download_mb_s=mb / downs[i],
            hashed_floor_cpu_s_gib=cpus[fastest(i)][i] / gib,
            upload_cpu_s_gib=cpus["upload"][i] / gib,
            download_cpu_s_gib=cpus["download"][i] / gib,
        )
    for name, times, median in (("upload", ups, up_s), ("download", downs, down_s)):
        vs_floor = [f / t for f, t in zip(floors, times, strict=True)]
        rec.figure(
            f"{name}, {args.mib} MiB, sha256 checked at both ends",
            mb / median,
            "MB/s",
            spread=(mb / max(times), mb / min(times)),
            baseline=("hashed floor: copy + sha256 + fsync", round(mb / floor_s, 1)),
            ratio=floor_s / median,
            ratio_spread=(min(vs_floor), max(vs_floor)),
            target=f">= {FLOOR_TARGET}",
            met=floor_s / median >= FLOOR_TARGET,
        )
    rec.figure(
        f"upload, {args.mib} MiB, against the checked floor",
        mb / up_s,
        "MB/s",
        baseline=("checked floor: copy + sha256 twice + fsync", round(mb / checked_s, 1)),
        ratio=checked_s / up_s,
        ratio_spread=(min(vs_checked), max(vs_checked)),
    )
    rec.figure("plain copy + fsync (reference)", mb / copy_s, "MB/s")
    for name in ("upload", "download"):
        rec.figure(f"{name}: CPU in all", statistics.median(cpus[name]) / gib, "core-s/GiB")
        rec.figure(
            f"{name}: CPU of the service alone",
            statistics.median(service_cpus[name]) / gib,
            "core-s/GiB",
        )
    rec.figure("hashed floor: CPU", floor_cpu, "core-s/GiB")
    for name, floor, floor_value in (
        ("download", "hashed floor", floor_cpu),
        ("upload", "checked floor", checked_cpu),  # (no target: the wall time's is the floor's)
    ):
        goal = (
            {"target": f">= {CPU_TARGET}", "met": cpu_ratios[name] >= CPU_TARGET}
            if name == "download"
            else {}
        )
        rec.figure(
            f"{name}: CPU per GiB against the {floor}'s",
            statistics.median(cpus[name]) / gib,
            "core-s/GiB",
            baseline=(f"{floor}: its cheapest method", round(floor_value, 2)),
            ratio=cpu_ratios[name],
            **goal,
        )
    rec.figure("service peak memory", peak, "MiB", target="flat in the file size")
    rec.write()
    print(f"load average after:         {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

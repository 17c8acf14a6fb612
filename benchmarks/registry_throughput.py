"""Registry service throughput: a 1 GiB file up and down, beside a plain local copy.

Runs the service (``torchyard.registry.service``) in a child process on loopback with an
authorizer that allows every request (this measures streaming, not TokenReview), uploads
a 1 GiB file with the launcher as a run's node Pod does (sha256 computed on both sides,
confirmed before the file becomes visible), downloads it back with the SDK (sha256
verified, fsynced), and compares both speeds with a plain local file copy
(``shutil.copyfile`` + fsync, in-kernel) of the same file measured in the same run. Prints
the service's peak memory (VmHWM), which must stay flat in the file size. Target: >= 0.7
of the copy speed; each line says whether it was met.

    .venv/bin/python benchmarks/registry_throughput.py [--mib 1024] [--repeat 3]
    .venv/bin/python benchmarks/registry_throughput.py --smoke   # 8 MiB, once (tests run this)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from torchyard.launcher import upload_file
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
        def allowed(self, user, verb, namespace):
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


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def verdict(ratio: float) -> str:
    return "target met" if ratio >= 0.7 else "TARGET MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the median is shown)")
    parser.add_argument("--smoke", action="store_true", help="8 MiB, one round")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.repeat = 8, 1
    size = args.mib << 20
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
            url = f"http://127.0.0.1:{port}/v1/namespaces/bench/runs/r/outputs/model.bin"

            client = RegistryClient(f"http://127.0.0.1:{port}", "x")
            copies, ups, downs = [], [], []
            for _ in range(args.repeat):  # interleaved, so drift hits all three alike
                started = time.monotonic()
                shutil.copyfile(src, work / "copy.bin")
                with (work / "copy.bin").open("rb") as f:
                    os.fsync(f.fileno())
                copies.append(time.monotonic() - started)
                (work / "copy.bin").unlink()

                started = time.monotonic()
                # The launcher's own upload: one pass, hashed while sent, the service's
                # sha256 confirmed before the file becomes visible.
                upload_file(url, str(src), "x")
                ups.append(time.monotonic() - started)

                started = time.monotonic()
                # The SDK's download: streamed, sha256-checked, fsynced, renamed into place.
                client.download_run_file(
                    "bench", "r", "outputs/model.bin", work / "down.bin", digest.hexdigest()
                )
                downs.append(time.monotonic() - started)
                (work / "down.bin").unlink()
            peak = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    mb = size / 1e6
    copy_s, up_s, down_s = (statistics.median(x) for x in (copies, ups, downs))
    print(f"file: {args.mib} MiB, median of {args.repeat} interleaved rounds")
    print(f"plain copy (baseline): {mb / copy_s:8.1f} MB/s")
    up_rounds = ", ".join(f"{c / u:.2f}" for c, u in zip(copies, ups, strict=True))
    down_rounds = ", ".join(f"{c / d:.2f}" for c, d in zip(copies, downs, strict=True))
    print(
        f"upload:                {mb / up_s:8.1f} MB/s   ratio {copy_s / up_s:5.2f}"
        f"   (target >= 0.7: {verdict(copy_s / up_s)}; rounds {up_rounds})"
    )
    print(
        f"download:              {mb / down_s:8.1f} MB/s   ratio {copy_s / down_s:5.2f}"
        f"   (target >= 0.7: {verdict(copy_s / down_s)}; rounds {down_rounds})"
    )
    print(f"service peak memory:   {peak:8.1f} MiB (flat in the file size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fetch throughput of an s3:// input against boto3's own transfer, on the same bytes.

A SeaweedFS S3 gateway (``tests/cluster/s3.py``, built from the pinned Go module) holds
``--objects`` objects of ``--mib`` MiB each under one prefix. Each round fetches the
prefix twice, interleaved so that drift hits both alike: torchyard's fetcher
(``torchyard.inputs.s3.fetch`` into an empty staging folder: listing, signed GETs,
ETag checks) and boto3's ``download_file`` of every listed object (its managed transfer:
ranged parts on a thread pool, as ``aws s3 cp --recursive`` does). boto3 runs in another
interpreter (``--boto3-python``, default ``python3``: boto3 is only the benchmark's
dependency, never the product's) and times itself from its first request, so neither
arm pays an interpreter's start. The figure is the median throughput of each arm and the
ratio torchyard / boto3 (target >= 0.8).

    python benchmarks/inputs.py [--objects 8 --mib 32 --repeat 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from benchmarks import record
from tests.cluster import s3 as store_server

from torchyard.inputs import s3
from torchyard.inputs.uris import Source

BOTO3 = """
import json, os, sys, time
import boto3
env, bucket, prefix, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
client = boto3.client(
    "s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
    aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
)
started = time.monotonic()
pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
for page in pages:
    for item in page.get("Contents", []):
        target = os.path.join(out, item["Key"][len(prefix):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        client.download_file(bucket, item["Key"], target)
print(time.monotonic() - started)
"""


def _boto3(python: str, env: dict[str, str], out: Path) -> float:
    done = subprocess.run(
        [python, "-c", BOTO3, json.dumps(env), "bench", "data/", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the boto3 arm failed ({python}; pip install boto3):\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def _torchyard(env: dict[str, str], out: Path) -> float:
    started = time.monotonic()
    s3.fetch(Source("s3://bench/data"), str(out), env, 1 << 40)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--mib", type=int, default=32, help="each object's size")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the median is shown)")
    parser.add_argument("--boto3-python", default="python3", help="an interpreter with boto3")
    parser.add_argument("--smoke", action="store_true", help="2 objects of 1 MiB, one round")
    record.add_argument(parser)
    args = parser.parse_args()
    rec = record.Record("inputs", args)
    if args.smoke:
        args.objects, args.mib, args.repeat = 2, 1, 1
    total = args.objects * (args.mib << 20)
    walls: dict[str, list[float]] = {"torchyard": [], "boto3": []}
    with store_server.running() as store, tempfile.TemporaryDirectory() as tmp:
        store.bucket("bench")
        for i in range(args.objects):
            store.put("bench", f"data/part-{i:03d}.bin", os.urandom(args.mib << 20))
        env = store.env()
        for i in range(args.repeat):
            for arm, run in (("torchyard", _torchyard), ("boto3", None)):
                out = Path(tmp) / f"{arm}-{i}"
                out.mkdir()
                took = _boto3(args.boto3_python, env, out) if run is None else run(env, out)
                walls[arm].append(took)
                rec.round(arm=arm, round=i + 1, seconds=round(took, 3), mb=total / 1e6)
                shutil.rmtree(out)
    mbs = {arm: [total / 1e6 / t for t in times] for arm, times in walls.items()}
    ours, theirs = statistics.median(mbs["torchyard"]), statistics.median(mbs["boto3"])
    ratio = ours / theirs
    print(f"{args.objects} objects x {args.mib} MiB, {args.repeat} round(s), SeaweedFS S3")
    for arm, values in mbs.items():
        print(f"  {arm:10s} {statistics.median(values):8.1f} MB/s  (rounds: {values})")
    verdict = "met" if ratio >= 0.8 else "not met"
    print(f"ratio torchyard / boto3: {ratio:.2f} (target >= 0.8: {verdict})")
    rec.figure(
        "s3:// fetch throughput",
        round(ours, 1),
        "MB/s",
        spread=(min(mbs["torchyard"]), max(mbs["torchyard"])),
        baseline=("boto3 download_file", round(theirs, 1)),
        ratio=round(ratio, 3),
        target=">= 0.8",
        met=ratio >= 0.8,
    )
    rec.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

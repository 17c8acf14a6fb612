"""Every benchmark in ``benchmarks/`` at its smallest size (``--smoke``), as a process of its
own, so that none rots unnoticed: each must exit 0 and print the lines its figures are
read from (its ratios against the baseline measured in the same run); a smoke run writes no
results file (benchmarks/record.py). The figures are not
judged here (a shared test machine's timings say little); what is checked is that every
part runs, including the counts that are exact (one build Job per recipe)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# script, the lines (regular expressions) its output must contain
BENCHMARKS = [
    (
        "inputs.py",
        [
            r"2 objects x 1 MiB, 1 round\(s\), SeaweedFS S3",
            r"\n  torchyard +\d+\.\d MB/s",
            r"\n  boto3 +\d+\.\d MB/s",
            r"ratio torchyard / boto3: \d+\.\d\d \(target >= 0\.8: (met|not met)\)",
        ],
    ),
    (
        "fanout.py",
        [
            r"round 3/3  N=   8  torchyard +\d+\.\d+s  ceiling +\d+\.\d+s  ratio +\d+\.\d+",
            # the operator's CPU per fan-out, and the Pod logs it read meanwhile
            r"operator CPU +\d+\.\d+s \(\d+\.\d+ ms/Pod\)  Pod logs read \d+\n",
            r"\n   8 .* +\d+\.\d+s \(\d+\.\d+-\d+\.\d+, \d+\.\d+ ms/Pod\)\n",
            r"median of 3 interleaved rounds",
            r"\n   8 +\d+\.\d+s \(\d+\.\d+-\d+\.\d+\) +\d+\.\d+s \(.*\) +\d+\.\d+ \(\d+\.\d+-",
            r"target: ratio <= 1\.5 at N = 256 \(not measured in this run\)",
            # the operator is a process of its own, not a thread of the benchmark
            r"operator process: CPU \d+\.\d+s, RSS \d+ MiB \(peak \d+ MiB\)",
        ],
    ),
    (
        "env_cache.py",
        [
            r"cache hit Ready \(median of 2\): +\d+ ms",
            r"ratio cache hit / curated: +\d+\.\d+",
            r"build Jobs for 6 Environments sharing 2 recipes, all Building: 2 +"
            r"\(target 2: target met\)",
        ],
    ),
    (
        "launch_overhead.py",
        [
            r"run 1/1 torchrun static +first step +\d+\.\d+s",
            r"ratio torchyard / torchrun standalone +first step +\d+\.\d+ +total +\d+\.\d+",
            r"ratio torchyard / torchrun static +first step +\d+\.\d+ +total +\d+\.\d+",
        ],
    ),
    (
        "scale.py",
        [
            r"scale: 50 runs, 1 node x 1 GPU each, pool a100 \(32 GPUs\)",
            r"every run has a phase +\d+\.\d+s +\d+\.\d+s",
            r"operator CPU until all phased +\d+\.\d+s +\d+\.\d+s",
            r"reconciles per run until then +\d+\.\d+ +\d+\.\d+",
            # the baseline's refill is timed in full runs only (--baseline-refills)
            r"freed slot -> next gang ungated +(\d+\.\d+s|never) +n/a",
            # the peers' refill end point (scale_peers.py compares it)
            r"freed slot -> next run's Pod Running +(\d+\.\d+s|never) +n/a",
            r"status lag p99 +\d+\.\d+s +\d+\.\d+s",
            r"idle CPU, queue full \(% of a core\) +\d+\.\d+% +\d+\.\d+%",
            r"RSS \(MiB\) +\d+\.\d+ +\d+\.\d+",
            r"restarted operator resynced +\d+\.\d+s +\d+\.\d+s",
        ],
    ),
    (
        "registry_throughput.py",
        [
            r"file: 8 MiB, median of 1 interleaved rounds",
            r"plain copy \(reference\): +\d+\.\d+ MB/s",
            r"hashed floor \(the fastest\): +\d+\.\d+ MB/s",
            # the fair baseline of an upload checked end to end: sha256 as sent and as received
            r"checked floor \(the fastest\): *\d+\.\d+ MB/s +\(copy \+ sha256 x2, fsync\)",
            r"upload, checked floor: +ratio +\d+\.\d+ \(rounds \d+\.\d+-\d+\.\d+\)",
            r"upload: +\d+\.\d+ MB/s +ratio to floor +\d+\.\d+ .* ratio to plain copy +\d+\.\d+",
            r"download: +\d+\.\d+ MB/s +ratio to floor +\d+\.\d+ .* ratio to plain copy +\d+\.\d+",
            r"service peak memory: +\d+\.\d+ MiB",
            r"upload, service alone: +cpu +\d+\.\d+ core-s/GiB +the floor's cpu / the service's",
            # the same comparison in CPU per GiB, which the machine's load changes far less
            r"download, cpu: +ratio +\d+\.\d+: the hashed floor's \d+\.\d+ core-s/GiB",
            r"upload, cpu: +ratio +\d+\.\d+: the checked floor's \d+\.\d+ core-s/GiB",
        ],
    ),
    (
        "peers.py",
        [
            r"round 3/3  N=   8  .*torchyard +\d+\.\d+s",
            r"\n   8  torchyard +\d+\.\d+s \(\d+\.\d+-\d+\.\d+\) +\d+\.\d+ \(.*\) +\d+\.\d+",
            r"\n   8  direct +\d+\.\d+s \(\d+\.\d+-\d+\.\d+\) +1\.00 ",
            r"API writes at N = 8 \(last round\), biggest items:\n  direct +.*pods POST 8",
            r"target: torchyard / direct <= 1\.3 at N = 256 \(not measured\)",
            # a gang restart replaces every Pod of the gang
            r"gang restart of N = 8.*\n  torchyard +\d+\.\d+s \(.*\)  Pods replaced 8 of 8",
            # gang admission: never two runs holding part of a gang at once
            r"\n  torchyard +drained +\d+\.\d+s .*most runs with a partial gang at once 1\n",
            r"torchyard operator process: CPU \d+\.\d+s, RSS \d+ MiB \(peak \d+ MiB\)",
            # --breakdown (on in --smoke): the steps before the first Pod measured apart
            r"where the time goes \(--breakdown\)",
            r"\n   8  torchyard +\d+\.\d+s( +\d+\.\d+s){6}\n",
            r"\n   8  torchyard +\d+\.\d+s +\d+\.\d+s +\d+\.\d+s +\((\d+\.\d+[ |]*){9}\)\n",
            r"\n   8  direct +- +\d+\.\d+s +- +- +\d+\.\d+s",
            # --breakdown of the gang restart: every step seen, the 8 Pods created once each
            r"where a gang restart of N = 8 goes \(--breakdown\)",
            r"\n  torchyard +(\d+\.\d+s +){6}8\.00\n",
        ],
    ),
    (
        "sweep_admission.py",
        [
            r"sweep admission: 40 one-GPU trials queued, 8 GPUs each "
            r"\(pools a100, a100-sweep\), 5 refills each",
            # each figure for the sweep and the plain TrainingRuns, and the ratio
            r"\nevery run has a phase +\d+\.\d+s +\d+\.\d+s +\d+\.\d+\n",
            r"\nslot freed -> next gang admitted p95 +\d+\.\d+s +\d+\.\d+s +\d+\.\d+\n",
            r"\nRSS \(MiB\) +\d+\.\d+ +\d+\.\d+ +\d+\.\d+\n",
            r"target: a sweep's trial admitted within 2 s of a freed slot, p95: \d+\.\d+s "
            r"\((met|not met); ratio to plain TrainingRuns \d+\.\d+\)",
        ],
    ),
    (
        "sweeps.py",
        [
            r"sweeps: 16 trials, 4 at a time, up to 9 epochs each",
            r"\nnone \(baseline\) +\d+\.\d +1\.000 +144 ",
            # every policy's trial-seconds against the baseline's, its best and gaps
            r"\nasha \(eta 3, 1 bracket\) +\d+\.\d +\d\.\d{3} +\d+ .* +\d+\.\d\d% +\d+\.\d\d%",
            r"\nbandit \(slack 0\.15, delay 10\) +\d+\.\d +\d\.\d{3} ",
            r"\nmedian \(delay 5\) +\d+\.\d +\d\.\d{3} ",
            r"\ntruncation \(20 %, delay 5\) +\d+\.\d +\d\.\d{3} ",
            r"over seeds 0\.\.1 \(min / median / max\):",
            r"target, asha \(eta 3, 1 bracket\): .* ratio \d\.\d{3}, gap \d+\.\d\d % "
            r"\((met|not met); met on \d of 2 seeds\)",
            # bayesian (TPE) against random on the same curve family, per seed
            r"\n +1  \d\.\d{6} / \d\.\d{5} / \d\.\d{5}   \d\.\d{6} / \d\.\d{5} / \d\.\d{5}\n",
            r"bayesian / random, regret of the best configuration sampled \(mean over seeds\): "
            r"\d+\.\d{3} ",
        ],
    ),
    (
        "inputs_cache.py",
        [
            r"cold run: no Pod while its input was fetched: yes; node Pod \d+\.\d\ds after",
            r"warm run created -> admitted: median \d+\.\d\ds, max \d+\.\d\ds; the same run "
            r"with no input \d+\.\d\ds \(ratio \d+\.\d\d\); fetch Jobs 0, bytes fetched 0",
            r"sweep of 4 trials: fetch Jobs 1 \(without the cache: 4\), fetch Pods run 1, ",
            r"target: a warm run admitted within 5 s, fetching nothing: (met|not met); one fetch "
            r"for the sweep: met",
        ],
    ),
    (
        "tensorboard_live.py",
        [
            r"tensorboard live: \d+ steps written after both served, one a second",
            r"\ntorchyard tensorboard +\d+\.\d\ds +\d+\.\d\ds +\d+\.\d\ds\n",
            r"\nTensorBoard alone +\d+\.\d\ds +\d+\.\d\ds +\d+\.\d\ds\n",
            r"target: a new scalar shown within 10 s, p95: \d+\.\d\ds \((met|not met); ratio",
        ],
    ),
    (
        "ui.py",
        [
            r"seeded 200 runs, 16 node Pods, 10000 points",
            r"metric of 10000 points -> 2000: cold +\d+\.\d ms, warm +\d+\.\d ms",
            r"apiserver list of 200 runs: +\d+\.\d ms",
            r"run page +cold +\d+\.\d ms +warm +\d+\.\d ms +payload +\d+\.\d KB",
            r"static page +cold +\d+\.\d ms +warm +\d+\.\d ms",
            r"runs list +cold +\d+\.\d ms +warm +\d+\.\d ms",
            r"payload queue +\d+\.\d KB",
            r"target: interactive < 1 s, first page < 1\.5 s, metric < 200 ms",
        ],
    ),
]
BENCHMARKS.append(
    (
        "placement.py",
        [
            r"\ndefault scheduler +\d+% +\d+\.\d\d +\d+\.\d\d +1\.00x\n",
            r"\ntorchyard required +\d+% +\d+\.\d\d",
            r"\nKueue required +\d+% +\d+\.\d\d",
            r"\nKueue preferred +\d+% +\d+\.\d\d +\d+\.\d\d +\d+\.\d\dx\n",
            r"\ntorchyard preferred +\d+% +\d+\.\d\d +\d+\.\d\d +\d+\.\d\dx\n",
            r"64-node run, torchyard: admission -> all Pods bound p95 \d+\.\d\ds",
            r"64-node run, Kueue: admission -> all Pods bound p95 \d+\.\d\ds",
        ],
    )
)
# scale.py runs two operators one after the other (the baseline refills a slot at its
# resync); placement.py starts Kueue (built before the tests, as for test_kueue.py)
TIMEOUTS = {"scale.py": 600, "peers.py": 420, "placement.py": 480}


@pytest.mark.parametrize(("script", "expected"), BENCHMARKS, ids=[b[0] for b in BENCHMARKS])
def test_the_benchmark_runs_at_its_smallest_size(script: str, expected: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["TORCHYARD_METRICS_PORT"] = "0"  # an in-process operator serves no /metrics
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--smoke"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUTS.get(script, 240),
    )
    took = time.monotonic() - started
    assert done.returncode == 0, f"{script} failed after {took:.0f}s:\n{done.stdout}\n{done.stderr}"
    for pattern in expected:
        assert re.search(pattern, done.stdout), f"{script}: no {pattern!r} in:\n{done.stdout}"
    print(f"\n[{script} --smoke: {took:.1f}s]\n{done.stdout}")


@pytest.mark.peers
def test_scale_prints_the_peers_columns() -> None:
    """``scale.py --peers`` at its smallest size: the same queue as TrainJobs and
    PyTorchJobs on Kubeflow's controllers (built from their Go modules: run with
    ``--peers``), each controller's figures beside torchyard's."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--smoke", "--peers",
         "--baseline", "none"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,  # under pytest's 600 s per test: it fires first, with the output
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    figure = r"(\d+\.\d+%?|never)"
    for pattern in [
        r"scale beside the peers: 50 one-GPU jobs, pool a100 \(32 GPUs\)",
        r"peers: jobset v0\.8\.2, kubeflow-trainer v2\.0\.0, training-operator v1\.8\.1",
        rf"every job has a status +{figure}s +{figure}s +\d+\.\d+ +{figure}s +\d+\.\d+",
        rf"freed slot -> next Pod Running +{figure}s +{figure}s +\S+ +{figure}s +\S+",
        rf"freed slot -> next run's status Running +{figure}s +n/a +n/a +n/a +n/a",
        rf"idle CPU, queue full \(% of a core\) +{figure} +{figure} +\S+ +{figure} +\S+",
        r"RSS \(MiB\) +\d+\.\d+ +\d+\.\d+ +\d+\.\d+ +\d+\.\d+ +\d+\.\d+",
    ]:
        assert re.search(pattern, done.stdout), f"no {pattern!r} in:\n{done.stdout}"
    print(done.stdout)

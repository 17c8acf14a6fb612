"""The benchmarks that need the REAL node, at their smallest size, so that none rots
unnoticed (the KWOK-only ones run in tests/integration/test_benchmarks_smoke.py).

``benchmarks/real_launch.py`` is run in this process on the session's real node
(``real_node``, tests/node/conftest.py) through its :func:`compare`, not as a process of its
own: one real node per machine, and a second one cannot start while the session holds it.
Its own ``main()`` only adds the harness start around :func:`compare`. The benchmark fails
by itself when a Pod ran anywhere but on the real node or a rank's first step is missing
from ``pods/log``; this test checks that every part ran and printed the lines its figures
are read from. The figures are not judged here, and a smoke run writes no results file.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator

pytestmark = pytest.mark.node

REPO = Path(__file__).resolve().parents[2]


def benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_real_launch_runs_at_its_smallest_size(
    real_node: RealNode,
    operator: InProcessOperator,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_launch = benchmark("real_launch")
    # the operator as it is: its node Pods need no torchyard image (no init container)
    results = real_launch.compare(real_node, namespace, repeats=1, steps=5, warmup=0)
    out = capsys.readouterr().out
    print(out)
    for pattern in (
        r"run 1/1 torchyard +every rank's first step +\d+\.\d+s \(ranks .*\), "
        r"containers running +\d+\.\d+s",
        r"run 1/1 bare Pods +every rank's first step +\d+\.\d+s \(ranks .*\), "
        r"containers running +\d+\.\d+s",
        r"real node real-0, world size 4 \(2 Pods x 2\), 5 steps, median of 1 runs",
        r"ratio torchyard / bare Pods: \d+\.\d+ \(per round \d+\.\d+-\d+\.\d+\) +"
        r"\(target <= 1\.15: (target met|TARGET MISSED)\)",
    ):
        assert re.search(pattern, out), f"no {pattern!r} in:\n{out}"
    # every rank of both arms reported its first step, after the first request was sent
    for arm in ("torchyard", "bare Pods"):
        (launch,) = results[arm]
        assert len(launch.firsts) == 4, (arm, launch)
        assert all(0 < first < 600 for first in launch.firsts), (arm, launch)
        assert 0 < launch.running < 600, (arm, launch)

"""torchyard.metrics: counters, gauges and histograms in the Prometheus text format 0.0.4,
thread-safe, without prometheus_client."""

from __future__ import annotations

import math
import re
import threading

import pytest

from torchyard import metrics

# A sample line of the text format: name, optional {labels}, a float.
SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
    r"(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$"
)


def lines_are_well_formed(text: str) -> list[str]:
    assert text.endswith("\n")
    lines = text.splitlines()
    for line in lines:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert SAMPLE.match(line), line
    return lines


def test_a_counter_renders_help_type_and_labelled_samples() -> None:
    registry = metrics.Registry()
    pods = registry.counter("torchyard_pods_created_total", "Pods created.", ["namespace"])
    pods.inc(2, namespace="team-b")
    pods.inc(namespace="team-a")
    pods.inc(3, namespace="team-a")
    assert lines_are_well_formed(registry.render()) == [
        "# HELP torchyard_pods_created_total Pods created.",
        "# TYPE torchyard_pods_created_total counter",
        'torchyard_pods_created_total{namespace="team-a"} 4.0',
        'torchyard_pods_created_total{namespace="team-b"} 2.0',
    ]
    assert pods.value(namespace="team-a") == 4.0
    assert pods.value(namespace="nowhere") == 0.0


def test_a_counter_without_labels_starts_at_zero_and_never_goes_down() -> None:
    registry = metrics.Registry()
    hits = registry.counter("hits_total", "Cache hits.")
    assert registry.render().splitlines()[-1] == "hits_total 0.0"
    with pytest.raises(ValueError, match="cannot go down"):
        hits.inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        hits.inc(kind="x")


def test_label_values_and_help_are_escaped() -> None:
    registry = metrics.Registry()
    gauge = registry.gauge("g", 'a "help"\nwith a \\ newline', ["path"])
    gauge.set(1.5, path='C:\\dir "x"\nnext')
    lines = lines_are_well_formed(registry.render())
    assert lines[0] == '# HELP g a "help"\\nwith a \\\\ newline'
    assert lines[2] == 'g{path="C:\\\\dir \\"x\\"\\nnext"} 1.5'


def test_a_gauge_goes_up_and_down_and_replace_swaps_every_value() -> None:
    registry = metrics.Registry()
    runs = registry.gauge("runs", "Runs by phase.", ["phase"])
    runs.inc(phase="Running")
    runs.inc(phase="Running")
    runs.dec(phase="Running")
    runs.set(7, phase="Queued")
    assert (runs.value(phase="Running"), runs.value(phase="Queued")) == (1.0, 7.0)
    runs.replace([({"phase": "Succeeded"}, 3)])
    assert registry.render().splitlines()[2:] == ['runs{phase="Succeeded"} 3.0']


def test_a_histogram_counts_cumulative_buckets_with_sum_and_count() -> None:
    registry = metrics.Registry()
    seconds = registry.histogram("wait_seconds", "Waits.", ["kind"], buckets=[1, 5])
    for value in (0.5, 1.0, 3.0, 60.0):
        seconds.observe(value, kind="run")
    assert lines_are_well_formed(registry.render())[2:] == [
        'wait_seconds_bucket{kind="run",le="1.0"} 2.0',
        'wait_seconds_bucket{kind="run",le="5.0"} 3.0',
        'wait_seconds_bucket{kind="run",le="+Inf"} 4.0',
        'wait_seconds_sum{kind="run"} 64.5',
        'wait_seconds_count{kind="run"} 4.0',
    ]
    assert seconds.count(kind="run") == 4 and seconds.sum(kind="run") == 64.5
    assert seconds.buckets[-1] == math.inf
    with pytest.raises(ValueError, match="le"):
        registry.histogram("bad", "A label named le.", ["le"])


def test_a_metric_name_is_registered_once() -> None:
    registry = metrics.Registry()
    registry.counter("x_total", "X.")
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("x_total", "X again.")


def test_concurrent_updates_are_not_lost() -> None:
    registry = metrics.Registry()
    counter = registry.counter("n_total", "N.", ["worker"])
    histogram = registry.histogram("h", "H.", buckets=[0.5])

    def work() -> None:
        for _ in range(5000):
            counter.inc(worker="all")
            histogram.observe(1.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.value(worker="all") == 40000
    assert histogram.count() == 40000 and histogram.sum() == 40000.0

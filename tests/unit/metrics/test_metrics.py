"""torchyard.metrics: counters, gauges and histograms through prometheus_client, one
registry per component with the process and platform collectors, served with content
negotiation (text format 0.0.4, or OpenMetrics when asked)."""

from __future__ import annotations

import math
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

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


def family(text: str, name: str) -> list[str]:
    """The lines of one metric family (its HELP, TYPE and samples, ``_created`` left out)."""
    lines = lines_are_well_formed(text)
    picked, inside = [], False
    for line in lines:
        if line.startswith("# HELP "):
            inside = line.split(" ")[2] == name
        if inside:
            picked.append(line)
    return picked


def test_a_counter_renders_help_type_and_labelled_samples() -> None:
    registry = metrics.Registry()
    pods = registry.counter("torchyard_pods_created_total", "Pods created.", ["namespace"])
    pods.inc(2, namespace="team-b")
    pods.inc(namespace="team-a")
    pods.inc(3, namespace="team-a")
    assert family(registry.render(), "torchyard_pods_created_total") == [
        "# HELP torchyard_pods_created_total Pods created.",
        "# TYPE torchyard_pods_created_total counter",
        'torchyard_pods_created_total{namespace="team-b"} 2.0',
        'torchyard_pods_created_total{namespace="team-a"} 4.0',
    ]
    assert pods.value(namespace="team-a") == 4.0
    assert pods.value(namespace="nowhere") == 0.0


def test_a_counter_without_labels_starts_at_zero_and_never_goes_down() -> None:
    registry = metrics.Registry()
    hits = registry.counter("hits_total", "Cache hits.")
    assert "hits_total 0.0" in registry.render().splitlines()
    with pytest.raises(ValueError, match="cannot go down"):
        hits.inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        hits.inc(kind="x")
    with pytest.raises(ValueError, match="takes labels"):
        hits.value(kind="x")


def test_label_values_and_help_are_escaped() -> None:
    registry = metrics.Registry()
    gauge = registry.gauge("g", 'a "help"\nwith a \\ newline', ["path"])
    gauge.set(1.5, path='C:\\dir "x"\nnext')
    assert family(registry.render(), "g") == [
        '# HELP g a "help"\\nwith a \\\\ newline',
        "# TYPE g gauge",
        'g{path="C:\\\\dir \\"x\\"\\nnext"} 1.5',
    ]


def test_a_gauge_goes_up_and_down_and_replace_swaps_every_value() -> None:
    registry = metrics.Registry()
    runs = registry.gauge("runs", "Runs by phase.", ["phase"])
    runs.inc(phase="Running")
    runs.inc(phase="Running")
    runs.dec(phase="Running")
    runs.set(7, phase="Queued")
    assert (runs.value(phase="Running"), runs.value(phase="Queued")) == (1.0, 7.0)
    runs.replace([({"phase": "Succeeded"}, 3)])
    assert family(registry.render(), "runs")[2:] == ['runs{phase="Succeeded"} 3.0']
    runs.set(1, phase="Failed")  # set between two replaces: the next replace decides
    runs.replace([({"phase": "Succeeded"}, 3), ({"phase": "Queued"}, 0)])
    assert sorted(family(registry.render(), "runs")[2:]) == [
        'runs{phase="Queued"} 0.0',
        'runs{phase="Succeeded"} 3.0',
    ]
    with pytest.raises(ValueError, match="takes labels"):
        runs.replace([({"state": "x"}, 1)])
    runs.replace([])
    assert family(registry.render(), "runs")[2:] == []


def test_a_histogram_counts_cumulative_buckets_with_sum_and_count() -> None:
    registry = metrics.Registry()
    seconds = registry.histogram("wait_seconds", "Waits.", ["kind"], buckets=[1, 5])
    for value in (0.5, 1.0, 3.0, 60.0):
        seconds.observe(value, kind="run")
    assert sorted(family(registry.render(), "wait_seconds")[2:]) == [
        'wait_seconds_bucket{kind="run",le="+Inf"} 4.0',
        'wait_seconds_bucket{kind="run",le="1.0"} 2.0',
        'wait_seconds_bucket{kind="run",le="5.0"} 3.0',
        'wait_seconds_count{kind="run"} 4.0',
        'wait_seconds_sum{kind="run"} 64.5',
    ]
    assert seconds.count(kind="run") == 4 and seconds.sum(kind="run") == 64.5
    assert seconds.buckets[-1] == math.inf
    with pytest.raises(ValueError, match="le"):
        registry.histogram("bad", "A label named le.", ["le"])


def test_a_metric_name_is_registered_once() -> None:
    registry = metrics.Registry()
    registry.counter("x_total", "X.")
    with pytest.raises(ValueError, match="Duplicated"):
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


def test_every_registry_has_the_process_and_platform_metrics() -> None:
    registry = metrics.Registry()
    samples = {s.name: s for s in registry.samples()}
    # RSS and CPU of this very process (Linux: read from /proc/self)
    assert samples["process_resident_memory_bytes"].value > 1 << 20
    assert samples["process_cpu_seconds_total"].value > 0
    assert samples["python_info"].labels["implementation"]
    # A second component's registry is its own: no metric of the first appears there.
    registry.counter("only_here_total", "Only in the first registry.")
    assert "only_here_total" not in {s.name for s in metrics.Registry().samples()}


@pytest.fixture
def served() -> Iterator[tuple[str, metrics.Registry]]:
    registry = metrics.Registry()
    registry.counter("torchyard_pods_created_total", "Pods created.", ["namespace"]).inc(
        2, namespace="team-a"
    )
    server = metrics.serve(registry, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", registry
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, accept: str | None = None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_the_server_negotiates_the_text_format_or_openmetrics(
    served: tuple[str, metrics.Registry],
) -> None:
    url, _ = served
    content_type, text = get(url + "/metrics")
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'torchyard_pods_created_total{namespace="team-a"} 2.0' in text.splitlines()
    assert re.search(r"^process_resident_memory_bytes \d", text, re.M)
    content_type, text = get(url + "/metrics", "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert "# TYPE torchyard_pods_created counter" in text.splitlines()
    assert 'torchyard_pods_created_total{namespace="team-a"} 2.0' in text.splitlines()
    assert text.endswith("# EOF\n")


def test_the_server_answers_only_on_metrics(served: tuple[str, metrics.Registry]) -> None:
    url, _ = served
    with pytest.raises(urllib.error.HTTPError) as err:
        get(url + "/other")
    assert err.value.code == 404

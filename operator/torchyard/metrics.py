"""Prometheus metrics through ``prometheus_client``: one registry per component, with the
process and platform collectors, exposed with content negotiation (the text format 0.0.4,
or OpenMetrics when the scraper asks for it).

Each component keeps its own :class:`Registry` (a ``prometheus_client.CollectorRegistry``
with ``process_*`` (RSS, CPU, open files) and ``python_info`` registered): the operator's
metrics are defined in ``controller/telemetry.py`` and served by :func:`serve`; the registry
service's are defined in ``registry/service.py`` and served by its aiohttp app
(``prometheus_client.aiohttp`` over :attr:`Registry.collectors`). The small wrappers
below keep the call sites short (``PODS_CREATED.inc(2, namespace=ns)``) and let tests
read a value back (:meth:`Counter.value`, :meth:`Histogram.count`) through the
registry's public ``collect()``. Every metric is thread-safe: reconcilers run in worker threads.

The launcher and the Environment builder do not import this module (they are standard
library only; pyproject.toml's import-linter contracts forbid it). Tested in
``tests/unit/metrics/test_metrics.py``; scraped in ``tests/integration/test_observability.py``
and ``test_registry_service.py``.

    registry = Registry()
    pods = registry.counter("torchyard_pods_created_total", "Pods created.", ["namespace"])
    pods.inc(2, namespace="team-a")
    registry.render()   # '# HELP torchyard_pods_created_total Pods created.\\n# TYPE ...'
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import exposition
from prometheus_client.samples import Sample

CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4
OPENMETRICS_CONTENT_TYPE = exposition.CONTENT_TYPE_LATEST
# Seconds, from a quick reconcile to a long wait for capacity.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PATH = "/metrics"


class _Metric:
    """A ``prometheus_client`` metric with keyword labels checked against its label names."""

    kind = "untyped"  # its Prometheus type

    def __init__(self, name: str, metric: Any, labelnames: Sequence[str], help: str = "") -> None:
        self._metric = metric
        self.name = name
        self.labelnames = tuple(labelnames)
        self.help = help

    def _child(self, labels: Mapping[str, str]) -> Any:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return self._metric.labels(**labels) if self.labelnames else self._metric

    def _sample(self, suffix: str, labels: Mapping[str, str]) -> float:
        """The value of sample ``<name><suffix>{labels}`` now (0 when it has none yet)."""
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        wanted = {k: str(v) for k, v in labels.items()}
        for family in self._metric.collect():
            for sample in family.samples:
                if sample.name == self.name + suffix and sample.labels == wanted:
                    return float(sample.value)
        return 0.0


class Counter(_Metric):
    """A value that only goes up (name it ``..._total``)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot go down ({amount})")
        self._child(labels).inc(amount)

    def value(self, **labels: str) -> float:
        return self._sample("", labels)


class Gauge(_Metric):
    """A value that goes up and down; :meth:`replace` swaps every labelled value at once."""

    kind = "gauge"

    def __init__(self, name: str, metric: Any, labelnames: Sequence[str], help: str = "") -> None:
        super().__init__(name, metric, labelnames, help)
        self._keys: set[tuple[str, ...]] = set()  # the label values of every series
        # what replace() last set, so that the next one touches only what changed
        self._replaced: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def _remember(self, labels: Mapping[str, str]) -> Any:
        child = self._child(labels)
        if self.labelnames:
            key = tuple(str(labels[n]) for n in self.labelnames)
            self._keys.add(key)
            self._replaced.pop(key, None)
        return child

    def set(self, value: float, **labels: str) -> None:
        with self._lock:
            self._remember(labels).set(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._remember(labels).inc(amount)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._remember(labels).dec(amount)

    def replace(self, values: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Set exactly these labelled values (the others disappear). The new values are set
        before the old series are removed, so a scrape in between never misses a series
        that stays."""
        with self._lock:
            new: dict[tuple[str, ...], float] = {}
            for labels, value in values:
                if set(labels) != set(self.labelnames):
                    raise ValueError(
                        f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}"
                    )
                new[tuple(str(labels[n]) for n in self.labelnames)] = float(value)
            for key, value in new.items():  # a watch event changes one or two of them
                if self._replaced.get(key) != value:
                    (self._metric.labels(*key) if key else self._metric).set(value)
            for key in self._keys - new.keys():
                self._metric.remove(*key)
            self._keys, self._replaced = set(new), new

    def value(self, **labels: str) -> float:
        return self._sample("", labels)


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        metric: Any,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        help: str = "",
    ) -> None:
        super().__init__(name, metric, labelnames, help)
        self.buckets = (*sorted(float(b) for b in buckets if not math.isinf(b)), math.inf)

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(value)

    def count(self, **labels: str) -> float:
        return self._sample("_count", labels)

    def sum(self, **labels: str) -> float:
        return self._sample("_sum", labels)


class Registry:
    """The metrics one component exposes, with the process and platform collectors;
    :attr:`defined` lists its own in the order they were defined (the documentation's
    metrics reference is made from it)."""

    def __init__(self) -> None:
        self.defined: list[_Metric] = []
        self.collectors = prometheus_client.CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.collectors)
        prometheus_client.PlatformCollector(registry=self.collectors)

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        metric = prometheus_client.Counter(name, help, labelnames, registry=self.collectors)
        counter = Counter(name, metric, labelnames, help)
        self.defined.append(counter)
        return counter

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        metric = prometheus_client.Gauge(name, help, labelnames, registry=self.collectors)
        gauge = Gauge(name, metric, labelnames, help)
        self.defined.append(gauge)
        return gauge

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        if "le" in labelnames:
            raise ValueError("a histogram's own label is le")
        metric = prometheus_client.Histogram(
            name, help, labelnames, registry=self.collectors, buckets=buckets
        )
        histogram = Histogram(name, metric, labelnames, buckets, help)
        self.defined.append(histogram)
        return histogram

    def samples(self) -> Iterator[Sample]:
        for family in self.collectors.collect():
            yield from family.samples

    def render(self, accept: str = "") -> str:
        """The exposition a scraper sending ``Accept: accept`` gets."""
        encoder, _ = exposition.choose_encoder(accept)
        return encoder(self.collectors).decode()


def content_type(accept: str = "") -> str:
    """The content type of what :meth:`Registry.render` gives a scraper sending ``Accept``."""
    return str(exposition.choose_encoder(accept)[1])


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per scrape is noise


def serve(registry: Registry, host: str = "0.0.0.0", port: int = 9090) -> WSGIServer:
    """Serve ``GET /metrics`` (404 elsewhere) in a daemon thread; raises OSError when the
    port is taken."""
    app = prometheus_client.make_wsgi_app(registry.collectors)

    def only_metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are on /metrics\n"]
        return app(environ, start_response)

    server = make_server(host, port, only_metrics, _Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server

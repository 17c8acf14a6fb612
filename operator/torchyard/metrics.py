"""Prometheus metrics without a dependency: counters, gauges and histograms, rendered in
the text exposition format 0.0.4, and a small HTTP server for ``/metrics``.

Standard library only (like the launcher), so that every layer may use it. Each
component keeps its own :class:`Registry`: the operator's metrics are defined in
``controller/telemetry.py``, the registry service's in ``registry/service.py``. Every
metric is thread-safe: reconcilers run in worker threads, the server in its own.

    registry = Registry()
    pods = registry.counter("torchyard_pods_created_total", "Pods created.", ["namespace"])
    pods.inc(2, namespace="team-a")
    registry.render()   # '# HELP torchyard_pods_created_total Pods created.\\n# TYPE ...'
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds, from a quick reconcile to a long wait for capacity.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LabelValues = tuple[str, ...]


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, str]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def samples(self) -> Iterator[str]:
        raise NotImplementedError

    def render(self) -> str:
        head = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        return "\n".join([*head, *self.samples()]) + "\n"


class _Scalar(_Metric):
    """One number per label set."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def _add(self, amount: float, labels: Mapping[str, str]) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> Iterator[str]:
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            yield f"{self.name}{_labels(self.labelnames, key)} {_number(value)}"


class Counter(_Scalar):
    """A value that only goes up (name it ``..._total``)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot go down ({amount})")
        self._add(amount, labels)


class Gauge(_Scalar):
    """A value that goes up and down; :meth:`replace` swaps every labelled value at once."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._add(-amount, labels)

    def replace(self, values: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Set exactly these labelled values (the others disappear)."""
        new = {self._key(labels): float(v) for labels, v in values}
        with self._lock:
            self._values = new


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help, labelnames)
        if "le" in self.labelnames:
            raise ValueError("a histogram's own label is le")
        bounds = sorted(float(b) for b in buckets)
        self.buckets = (*(b for b in bounds if not math.isinf(b)), math.inf)
        # per label values: [count per bucket (not cumulative)..., sum]
        self._values: dict[LabelValues, list[float]] = {}
        if not labelnames:
            self._values[()] = [0.0] * (len(self.buckets) + 1)

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        index = next(i for i, bound in enumerate(self.buckets) if value <= bound)
        with self._lock:
            cells = self._values.setdefault(key, [0.0] * (len(self.buckets) + 1))
            cells[index] += 1
            cells[-1] += value

    def count(self, **labels: str) -> float:
        with self._lock:
            cells = self._values.get(self._key(labels))
            return sum(cells[:-1]) if cells else 0.0

    def sum(self, **labels: str) -> float:
        with self._lock:
            cells = self._values.get(self._key(labels))
            return cells[-1] if cells else 0.0

    def samples(self) -> Iterator[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._values.items())
        names = (*self.labelnames, "le")
        for key, cells in items:
            running = 0.0
            for bound, n in zip(self.buckets, cells[:-1], strict=True):
                running += n
                labels = _labels(names, (*key, _number(bound)))
                yield f"{self.name}_bucket{labels} {_number(running)}"
            plain = _labels(self.labelnames, key)
            yield f"{self.name}_sum{plain} {_number(cells[-1])}"
            yield f"{self.name}_count{plain} {_number(running)}"


class Registry:
    """The metrics one component exposes, rendered together."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _add(self, metric: _Metric) -> None:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name} is already registered")
            self._metrics[metric.name] = metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, labelnames)
        self._add(metric)
        return metric

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, labelnames)
        self._add(metric)
        return metric

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        metric = Histogram(name, help, labelnames, buckets)
        self._add(metric)
        return metric

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(m.render() for m in metrics)


def serve(registry: Registry, host: str = "0.0.0.0", port: int = 9090) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` in a daemon thread; raises OSError when the port is taken."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = registry.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape is noise

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server

"""The operator's Prometheus metrics, and the server that exposes them on ``/metrics``.

Updated by ``handlers`` (runs by phase from the watch), ``workqueue`` (reconcile
durations and errors), ``admission`` (Pods created), ``trainingruns`` (admission waits)
and ``environments`` (Environment builds); served by
:func:`serve`, which ``operators.run`` calls once per process (an operator restarted in
the same process, as the tests do, keeps the server and its counters).
"""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer

from torchyard import api, metrics

DEFAULT_PORT = 9090
REGISTRY = metrics.Registry()
# Waits for capacity last from seconds to hours.
WAIT_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
BUILD_BUCKETS = (5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)

TRAININGRUNS = REGISTRY.gauge(
    "torchyard_trainingruns",
    "TrainingRuns by namespace and phase, as the operator's watch sees them.",
    ["namespace", "phase"],
)
RECONCILE_SECONDS = REGISTRY.histogram(
    "torchyard_reconcile_duration_seconds",
    "Time one reconcile of an object took, by kind.",
    ["kind"],
)
RECONCILE_ERRORS = REGISTRY.counter(
    "torchyard_reconcile_errors_total",
    "Reconciles that failed and were queued again with backoff, by kind.",
    ["kind"],
)
PODS_CREATED = REGISTRY.counter(
    "torchyard_pods_created_total",
    "Node Pods the operator created, by namespace.",
    ["namespace"],
)
ADMISSION_WAIT_SECONDS = REGISTRY.histogram(
    "torchyard_admission_wait_seconds",
    "From a TrainingRun's creation to the admission of its gang (first attempt).",
    [],
    buckets=WAIT_BUCKETS,
)
BUILD_SECONDS = REGISTRY.histogram(
    "torchyard_environment_build_duration_seconds",
    "Duration of Environment build Jobs, by result (succeeded or failed).",
    ["result"],
    buckets=BUILD_BUCKETS,
)
BUILDS = REGISTRY.counter(
    "torchyard_environment_builds_total",
    "Environment builds that ended, by result (succeeded or failed).",
    ["result"],
)
CACHE_HITS = REGISTRY.counter(
    "torchyard_environment_cache_hits_total",
    "Environments that became Ready because their image was already in the registry.",
)

_PHASES: dict[tuple[str, str], str] = {}
_PHASES_LOCK = threading.Lock()
_SERVERS: dict[int, ThreadingHTTPServer] = {}
_SERVERS_LOCK = threading.Lock()
logger = logging.getLogger("torchyard.controller")


def run_phase(namespace: str, name: str, phase: str | None) -> None:
    """Record a run's phase (None: the run is gone) and recount the gauge, zeros included,
    so that a phase nobody is in any more reads 0 rather than its last value."""
    with _PHASES_LOCK:
        if phase is None:
            _PHASES.pop((namespace, name), None)
        else:
            _PHASES[(namespace, name)] = phase or api.Phase.PENDING.value
        namespaces = {ns for ns, _ in _PHASES}
        counts = {(ns, p.value): 0 for ns in namespaces for p in api.Phase}
        for (ns, _), p in _PHASES.items():
            counts[(ns, p)] = counts.get((ns, p), 0) + 1
        TRAININGRUNS.replace(
            ({"namespace": ns, "phase": p}, float(n)) for (ns, p), n in counts.items()
        )


def reset_run_phases() -> None:
    """Forget every run (a starting operator learns them again from its watch)."""
    with _PHASES_LOCK:
        _PHASES.clear()
        TRAININGRUNS.replace(())


def serve(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer | None:
    """Serve ``/metrics`` on ``port`` once per process (0: not at all). A port that is
    taken is logged, not fatal: metrics are not worth stopping the operator for."""
    if port == 0:
        return None
    with _SERVERS_LOCK:
        if port in _SERVERS:
            return _SERVERS[port]
        try:
            server = metrics.serve(REGISTRY, host, port)
        except OSError as err:
            logger.warning("cannot serve metrics on %s:%d: %s", host, port, err)
            return None
        _SERVERS[port] = server
        logger.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)
        return server

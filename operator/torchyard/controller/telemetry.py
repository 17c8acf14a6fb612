"""The operator's Prometheus metrics, and the server that exposes them on ``/metrics``
(``prometheus_client`` through ``torchyard.metrics``: with the process's RSS and CPU).

Updated by ``handlers`` (runs by phase from the watch), ``workqueue`` (reconcile
durations and errors), ``admission`` (Pods created), ``trainingruns`` (admission waits)
and ``environments`` (Environment builds); served by
:func:`serve`, which ``operators.run`` calls once per process (an operator restarted in
the same process, as the tests do, keeps the server and its counters).
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

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
_COUNTS: dict[tuple[str, str], int] = {}  # (namespace, phase) -> runs, kept with _PHASES
_PHASES_LOCK = threading.Lock()
_SERVERS: dict[int, WSGIServer] = {}
_SERVERS_LOCK = threading.Lock()
logger = logging.getLogger("torchyard.controller")


def run_phase(namespace: str, name: str, phase: str | None) -> None:
    """Record a run's phase (None: the run is gone) and recount the gauge, zeros included,
    so that a phase nobody is in any more reads 0 rather than its last value."""
    with _PHASES_LOCK:
        # Counted as they change, not recounted per event: a watch event of one run among
        # thousands costs the event loop a few dictionary operations.
        was = _PHASES.get((namespace, name))
        now = None if phase is None else (phase or api.Phase.PENDING.value)
        if was == now:
            return
        if now is None:
            del _PHASES[(namespace, name)]
        else:
            _PHASES[(namespace, name)] = now
            _COUNTS[(namespace, now)] = _COUNTS.get((namespace, now), 0) + 1
        if was is not None:
            _COUNTS[(namespace, was)] -= 1
        namespaces = {ns for (ns, _), n in _COUNTS.items() if n > 0}
        for key in [k for k, n in _COUNTS.items() if n <= 0 and k[0] not in namespaces]:
            del _COUNTS[key]  # a namespace with no runs left: its series go
        TRAININGRUNS.replace(
            ({"namespace": ns, "phase": p.value}, float(_COUNTS.get((ns, p.value), 0)))
            for ns in sorted(namespaces)
            for p in api.Phase
        )


def reset_run_phases() -> None:
    """Forget every run (a starting operator learns them again from its watch)."""
    with _PHASES_LOCK:
        _PHASES.clear()
        _COUNTS.clear()
        TRAININGRUNS.replace(())


def serve(port: int, host: str = "0.0.0.0") -> WSGIServer | None:
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

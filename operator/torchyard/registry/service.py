"""The model registry's HTTP service: it owns the registry volume, everything else asks it.

Runs (and users) stream run outputs and logs in, promote a run's outputs to a new model
version, list models and versions, read manifests and stream files back (HTTP Range).
This module is the service's face: :func:`create_app` assembles the routes below and
:func:`serve` runs them (``torchyard registry serve``, through ``torchyard.registry_server``).
The parts live beside it, one concern each:

- ``variables``: every path variable of every route is checked in one place
  (:func:`~torchyard.registry.variables.checked_variables`, against :data:`VARIABLES`)
  before a handler runs; :func:`create_app` refuses to start when a route has a variable
  with no rule.
- ``access``: every request carries a Kubernetes bearer token (``Authorization: Bearer``,
  or ``X-Torchyard-Token`` through the apiserver's service proxy); an :class:`Authorizer`
  (``registry.auth``: TokenReview + SubjectAccessReview, wired to ``torchyard.k8s`` by
  ``torchyard registry serve``) decides: no or bad token -> 401; not allowed in that
  namespace -> 403. Uploading and promoting need ``create`` on ``modelversions`` in the
  namespace, reading needs ``get``. Writing a run's archive (PUT/POST under
  ``runs/{run}/``) is for that run's node Pods only: the caller must be the
  ServiceAccount of TrainingRun ``{run}`` (``spec.serviceAccountName``, else
  ``default``). Tokens are never logged; the Authorizer's answers are cached, bounded.
  Every path the service opens is resolved and must stay under ``<root>/<namespace>/``
  (``Store.inside``): encoded ``..``, absolute paths, NUL bytes, overlong names and
  symbolic links planted in the volume all end in 400 or 404.
- ``bodies``: uploads are written to a temporary file while their sha256 is computed,
  fsynced and renamed into place, so a killed service never leaves a partial file
  visible; memory stays flat in the file size. Uploads and source snapshots have size
  limits (:class:`Limits`, 413 beyond).
- ``archives``: the routes of run archives and source snapshots; ``versions``: the routes
  of models (promote, list, manifest, files); ``records``: the routes of run records
  (written by the operator alone: ``create`` on ``runrecords``).
- ``tls``: :func:`serve` speaks HTTPS with :class:`TLSFiles` (``--tls-cert``/``--tls-key``;
  a renewed certificate is loaded within a minute), else plain HTTP with a warning.

Tested in ``tests/unit/registry/`` (``test_service.py`` with the hostile requests of
``hostile.py``, ``test_tls_and_tokens.py``) and ``tests/integration/test_registry_service.py``,
``test_registry_tls.py``, ``test_archiving.py``.

    PUT  /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}    upload a file
         ?commit=later: 202 with the sha256 the service computed and an upload id;
    POST /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}?upload=ID  with the
         client's X-Content-SHA256: renames it into place (a one-pass client)
    GET  /v1/namespaces/{ns}/runs/{run}/{outputs|logs}/{path}    download (Range; ?uid=: of
                                            that run, where a later run moved it)
    GET  /v1/namespaces/{ns}/runs/{run}                          its files (?uid=, likewise)
    POST /v1/namespaces/{ns}/models/{model}/versions             promote {"run", "path"}
    GET  /v1/namespaces/{ns}/models                              models and versions
    GET  /v1/namespaces/{ns}/models/{model}/versions/{v}         manifest
    GET  /v1/namespaces/{ns}/models/{model}/versions/{v}/files/{path}   download (Range)
    PUT  /v1/namespaces/{ns}/records/{kinds}/{name}/{uid}       a run record (the operator)
    GET  /v1/namespaces/{ns}/records/{kinds}                     summaries, newest first
         ?phase= &experiment= &labelSelector= &since= &limit= &continue=
    GET  /v1/namespaces/{ns}/records/{kinds}/{name}[/{uid}]      a record (default: newest)
    GET  /v1/namespaces/{ns}/records/{kinds}/{name}/{uid}/metrics    its metrics.jsonl
    GET  /metrics                                                Prometheus (bytes, RSS, CPU)
    PUT  /v1/namespaces/{ns}/snapshots/{sha256}                 a source snapshot
    GET  /v1/namespaces/{ns}/snapshots/{sha256}                 (HEAD: is it there?)
    GET  /v1/namespaces/{ns}/endpoints/{name}/access            may this token call the
                                            OnlineEndpoint? (a serving Pod asks; ``endpoints``)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from torchyard import metrics
from torchyard.registry.access import Access
from torchyard.registry.archives import Archives
from torchyard.registry.auth import Authorizer as Authorizer  # (re-exported)
from torchyard.registry.auth import CachingAuthorizer
from torchyard.registry.auth import ExpiringCache as ExpiringCache  # (re-exported)
from torchyard.registry.auth import RunIdentity as RunIdentity  # (re-exported)
from torchyard.registry.bodies import MAX_JSON_BODY
from torchyard.registry.bodies import Limits as Limits  # (re-exported)
from torchyard.registry.endpoints import EndpointAccess
from torchyard.registry.records import RecordRoutes
from torchyard.registry.store import Store
from torchyard.registry.tls import TLSFiles as TLSFiles  # (re-exported)
from torchyard.registry.tls import reloading
from torchyard.registry.variables import VARIABLES as VARIABLES  # (re-exported)
from torchyard.registry.variables import checked_variables, unruled
from torchyard.registry.variables import path_problem as path_problem  # (re-exported)
from torchyard.registry.versions import Versions

logger = logging.getLogger("torchyard.registry")


def create_app(
    store: Store, authorizer: Authorizer, limits: Limits | None = None
) -> web.Application:
    """The service's routes over ``store``; every caller is asked of ``authorizer``."""
    access = Access(store, authorizer)
    archives = Archives(access, limits or Limits())
    versions = Versions(access)

    async def healthz(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_JSON_BODY, middlewares=[checked_variables])
    prefix = "/v1/namespaces/{ns}"
    runs = prefix + "/runs/{run}/{kind:outputs|logs}/{path:.+}"
    app.router.add_get(prefix + "/runs/{run}", archives.list_run)
    app.router.add_put(runs, archives.upload)
    app.router.add_post(runs, archives.commit)
    app.router.add_get(runs, archives.download)
    app.router.add_post(prefix + "/models/{model}/versions", versions.promote)
    app.router.add_get(prefix + "/models", versions.models)
    app.router.add_get(prefix + "/models/{model}/versions/{v}", versions.manifest)
    app.router.add_get(prefix + "/models/{model}/versions/{v}/files/{path:.+}", versions.download)
    snapshots = prefix + "/snapshots/{sha:[a-f0-9]{64}}"
    app.router.add_put(snapshots, archives.put_snapshot)
    app.router.add_get(snapshots, archives.get_snapshot)  # also answers HEAD
    records = RecordRoutes(access)
    kinds = prefix + "/records/{kinds}"
    app.router.add_get(kinds, records.list_)
    app.router.add_get(kinds + "/{name}", records.get)
    app.router.add_put(kinds + "/{name}/{uid}", records.put)
    app.router.add_get(kinds + "/{name}/{uid}", records.get)
    app.router.add_get(kinds + "/{name}/{uid}/metrics", records.metrics)
    app.router.add_get(prefix + "/endpoints/{name}/access", EndpointAccess(authorizer).check)
    app.router.add_get("/healthz", healthz)
    _add_metrics(app)
    unchecked = unruled(app.router.resources())
    if unchecked:  # a new route must say what its variables may hold
        raise RuntimeError(f"route variables without a rule in VARIABLES: {unchecked}")
    return app


def metrics_registry() -> tuple[metrics.Registry, metrics.Counter, metrics.Counter]:
    """A new registry of the service's metrics, and its counters of the bytes of files
    received (uploads of run files and snapshots) and sent (downloads)."""
    registry = metrics.Registry()
    received = registry.counter(
        "torchyard_registry_received_bytes_total",
        "Bytes of files uploaded (run outputs and logs, source snapshots).",
    )
    sent = registry.counter(
        "torchyard_registry_sent_bytes_total",
        "Bytes of files downloaded (run files, model files, source snapshots).",
    )
    return registry, received, sent


def _add_metrics(app: web.Application) -> None:
    """``GET /metrics`` (Prometheus, no token: counters only) with the bytes of files the
    service received and sent (:func:`metrics_registry`), and the process's own
    (``process_resident_memory_bytes``, CPU seconds) through ``prometheus_client``;
    OpenMetrics for a scraper that asks for it."""
    registry, received, sent = metrics_registry()

    @web.middleware
    async def count_received(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if request.method == "PUT":
                received.inc(request.content.total_bytes)

    async def count_sent(request: web.Request, response: web.StreamResponse) -> None:
        if isinstance(response, web.FileResponse) and request.method != "HEAD":
            sent.inc(response.content_length or 0)

    expose = make_aiohttp_handler(registry.collectors)  # content negotiation

    async def scrape(request: web.Request) -> web.StreamResponse:
        response: web.StreamResponse = await expose(request)
        return response

    app.middlewares.append(count_received)
    app.on_response_prepare.append(count_sent)
    app.router.add_get(metrics.PATH, scrape)


def serve(
    root: Path,
    authorizer: Authorizer,
    host: str = "0.0.0.0",
    port: int = 8080,
    tls: TLSFiles | None = None,
    reload_seconds: float = 60.0,
    limits: Limits | None = None,
) -> None:
    """Run the service until interrupted (``torchyard registry serve``): over HTTPS with
    ``tls`` (reloading renewed files every ``reload_seconds``), else plain HTTP with a
    warning, since bearer tokens and model files would cross the network in the clear."""
    store = Store(root)
    store.remove_all_temporaries()  # the service owns the volume: nothing else writes there
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # no headers in logs
    app = create_app(store, CachingAuthorizer(authorizer), limits)
    if tls is None:
        logger.warning(
            "serving plain HTTP: bearer tokens and model files cross the network unencrypted; "
            "pass --tls-cert and --tls-key (the Helm chart does, registry.tls.enabled)"
        )
    else:
        app.cleanup_ctx.append(reloading(tls, reload_seconds))
    web.run_app(
        app,
        host=host,
        port=port,
        ssl_context=tls.context if tls else None,
        print=lambda text: logger.info("%s", text),
        access_log=None,
    )

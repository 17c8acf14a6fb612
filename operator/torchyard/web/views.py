"""The web view's routes: each checks what it was asked (``queries``), reads through the
:class:`~torchyard.web.source.RunSource` (in the thread pool: the client is synchronous)
and renders a page (``pages``) or JSON for the page's script (``/api/...``: the runs
list's refresh, a log tail, a downsampled metric), or streams a file of a run's archive
from the registry.

Changing anything is a POST from the view's own origin with the page's token (never a
GET; ``csrf`` checks both before a route runs), done with the caller's own rights: the
apiserver's 403 is shown as it is. Called by ``torchyard.web.app``; tested in tests/unit/web/ and
tests/integration/web/.
"""

from __future__ import annotations

import asyncio
import functools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from torchyard import k8s
from torchyard.sdk import runs
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.web import access, csrf, endpoint_pages, html, lttb, pages, queries, recorded
from torchyard.web.queries import Refusal
from torchyard.web.source import Archive, RunSource, Unavailable, add_metrics

T = TypeVar("T")
Obj = dict[str, Any]
SOURCE = web.AppKey("source", RunSource)
NAMESPACE = web.AppKey("namespace", str)
REVIEWS = web.AppKey("reviews", access.Reviews)
CALLER = web.RequestKey("caller", RunSource)  # the request's AuthorizedSource (in the cluster)
HOME = web.RequestKey("home", str)  # the caller's own namespace
CHARTS = ("uplot.iife.min.js", "charts.js")
RUN_ACTIONS = ("suspend", "resume")
SWEEP_ACTIONS = ("cancel",)
READ_ERRORS = (k8s.ApiError, k8s.Unreachable)
DOWNLOAD_CHUNK = 1 << 20  # bytes of an archived file read from the registry at a time


async def read(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the thread pool (the Kubernetes client blocks)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args))


async def found(request: web.Request, fn: Callable[[str, str], T | None], what: str) -> T:
    """``fn(namespace, name)`` of the request's path, or 404 when it is not there."""
    ns, name = ns_of(request), name_of(request, f"{what} name")
    obj = await read(request, fn, ns, name)
    if obj is None:
        raise Refusal(f"{what} {ns}/{name} not found", 404)
    return obj


def _source(request: web.Request) -> RunSource:
    """The request's caller's source (in the cluster), else the app's (the kubeconfig's)."""
    return request[CALLER] if CALLER in request else request.app[SOURCE]


async def caller(request: web.Request) -> None:
    """In the cluster: the caller of the request, by its token's TokenReview, reads
    through a source of its own; no token (or a bad one): to /login (401 under /api/)."""
    reviews = request.app[REVIEWS]
    token = request.cookies.get(access.COOKIE, "")
    user = await read(request, reviews.user, token) if token else None
    if user is None:
        if request.path.startswith("/api/"):
            raise Refusal("no valid token: open /login and paste a Kubernetes token", 401)
        raise web.HTTPSeeOther("/login")
    request[CALLER] = access.AuthorizedSource(request.app[SOURCE], user, reviews)
    request[HOME] = access.home_namespace(user) or request.app[NAMESPACE]


async def login_page(request: web.Request) -> web.Response:
    queries.only(request.query, ())
    return respond(
        request, "Sign in with a Kubernetes token", html.login_form(csrf.token(request)), ""
    )


async def login(request: web.Request) -> web.Response:
    """The pasted token, checked by TokenReview, kept in the browser's cookie only; the
    browser gets a new id (``csrf``: the signed-out page's tokens end here)."""
    if REVIEWS not in request.app:
        raise Refusal("this server uses the kubeconfig it was started with: no login", 404)
    form = await request.post()
    token = str(form.get("k8s_token") or "").strip()
    user = await read(request, request.app[REVIEWS].user, token)
    if user is None:
        raise Refusal("the apiserver does not accept this token (TokenReview)", 401)
    home = access.home_namespace(user) or request.app[NAMESPACE]
    response = web.HTTPSeeOther(html.path("ns", home, "runs"))
    response.set_cookie(
        access.COOKIE, token, httponly=True, samesite="Strict", secure=request.secure, path="/"
    )
    csrf.renew(request)
    raise response


async def logout(request: web.Request) -> web.Response:
    response = web.HTTPSeeOther("/login")
    response.del_cookie(access.COOKIE, path="/")
    csrf.renew(request)
    raise response


def ns_of(request: web.Request) -> str:
    return queries.namespace(request.match_info["ns"])


def name_of(request: web.Request, what: str = "name") -> str:
    return queries.name(request.match_info["name"], what)


def respond(
    request: web.Request, title: str, body: str, current: str, *, scripts: tuple[str, ...] = ()
) -> web.Response:
    text = html.page(
        title,
        body,
        namespace=request.match_info.get("ns", request.app[NAMESPACE]),
        current=current,
        token=csrf.token(request),
        scripts=("app.js", *scripts),
        signed_in=CALLER in request,
    )
    return web.Response(text=text, content_type="text/html")


async def home(request: web.Request) -> web.Response:
    queries.only(request.query, ())
    raise web.HTTPFound(
        html.path("ns", request[HOME] if HOME in request else request.app[NAMESPACE], "runs")
    )


async def open_namespace(request: web.Request) -> web.Response:
    queries.only(request.query, ("namespace",))
    ns = queries.namespace(request.query.get("namespace", ""))
    raise web.HTTPFound(html.path("ns", ns, "runs"))


async def with_records(
    request: web.Request, section: str, live: list[Obj], filt: queries.RunFilter | None = None
) -> tuple[list[Obj], str]:
    """The live objects of a list and the records of those that are gone (and, when the
    records cannot be read, why)."""
    ns = ns_of(request)
    query = recorded.query(recorded.KIND_OF[section], filt)
    try:
        page = await read(request, _source(request).record_page, ns, query)
    except Unavailable as err:
        return live, f"records of what ended: {err}"
    return recorded.with_records(live, page), ""


async def _runs_page(
    request: web.Request,
) -> tuple[str, queries.RunFilter, list[Obj], int, str]:
    """The runs page's rows, live and recorded, as its query asks (for HTML and JSON)."""
    ns = ns_of(request)
    filt = queries.run_filter(request.query, request.query.getall)
    live = await read(request, _source(request).runs, ns)
    every, note = await with_records(request, "runs", live, filt)
    items, total = queries.select_runs(every, filt)
    return ns, filt, items, total, note


async def runs_list(request: web.Request) -> web.Response:
    ns, filt, items, total, note = await _runs_page(request)
    body = pages.runs_list(ns, items, total, filt, note)
    return respond(request, f"Runs in {ns}", body, "runs")


async def runs_json(request: web.Request) -> web.Response:
    _, _, items, total, note = await _runs_page(request)
    return web.json_response({"total": total, "items": [brief(r) for r in items], "note": note})


def brief(run: Obj) -> dict[str, Any]:
    st = run.get("status") or {}
    mark = recorded.mark(run) or {}
    return {
        "name": run["metadata"]["name"],
        "uid": run["metadata"].get("uid"),
        "deleted": bool(mark.get("deleted")),
        "recorded": bool(mark),
        "phase": st.get("phase") or "Pending",
        "phaseClass": html.PHASE_CLASSES.get(st.get("phase") or "Pending", ""),
        "progress": runs.progress_text(st.get("progress")),
        "eta": (st.get("progress") or {}).get("eta"),
        "ready": (st.get("nodes") or {}).get("ready", "0/0"),
    }


async def run_page(request: web.Request) -> web.Response:
    ns, name = ns_of(request), name_of(request, "TrainingRun name")
    queries.only(request.query, ())
    src = _source(request)
    run = await read(request, src.run, ns, name)
    if run is None:
        return await show_record(request, "runs", await the_record(request, "runs"), None)
    pods, events, archive = await asyncio.gather(
        read(request, src.pods, ns, name),
        read(request, src.events, run),
        read(request, src.archive, ns, name, run["metadata"].get("uid")),
    )
    phase = (run.get("status") or {}).get("phase")
    if phase in runs.TERMINAL and not pods:  # (its Pods collected by its TTL)
        kept = await _record_of(request, run)
        if kept is not None:
            return await show_record(request, "runs", kept, run)
    actions = ""
    if phase not in runs.TERMINAL:
        act = "resume" if (run.get("spec") or {}).get("suspend") else "suspend"
        actions = html.action_form(
            html.path("ns", ns, "runs", name, act), act.capitalize(), csrf.token(request)
        )
    body = pages.run_page(ns, run, pods, events, archive, actions)
    return respond(request, f"Run {name}", body, "runs", scripts=CHARTS)


async def the_record(request: web.Request, section: str) -> Any:
    """The record the request's path names (``.../NAME[/records/UID]``), or 404 saying
    why there is none."""
    ns, name = ns_of(request), name_of(request, f"{recorded.KIND_OF[section]} name")
    uid = queries.uid(request.match_info["uid"]) if "uid" in request.match_info else None
    kind = recorded.KIND_OF[section]
    try:
        record = await read(request, _source(request).record, ns, name, uid, kind)
    except Unavailable as err:
        raise Refusal(f"{kind} {ns}/{name} not found; its record: {err}", 404) from None
    if record is None:
        raise Refusal(f"{kind} {ns}/{name} not found, and no record of it", 404)
    return record


async def _record_of(request: web.Request, run: Obj) -> Any:
    """The record of this very run (its uid), None when there is none or it is out of reach."""
    meta = run["metadata"]
    try:
        return await read(
            request,
            _source(request).record,
            meta["namespace"],
            meta["name"],
            meta.get("uid"),
            "TrainingRun",
        )
    except (Unavailable, Refusal):
        return None


async def record_page(request: web.Request) -> web.Response:
    """What a record holds: the object is gone (or the path names one record)."""
    queries.only(request.query, ())
    section = _section(request)
    return await show_record(request, section, await the_record(request, section), UNREAD)


UNREAD: Obj = {}  # (show_record's ``live`` when the view did not read the live run)


async def show_record(
    request: web.Request, section: str, record: Any, live: Obj | None
) -> web.Response:
    """The record's page; ``live``: the run of its name now (None: none; :data:`UNREAD`:
    not read yet), which says whether the archive under the name is the record's."""
    ns = ns_of(request)
    if section == "sweeps":
        sweep = recorded.record_object(record)
        trials = sweep_sdk.trials_of(sweep, None)
        body = pages.record_note(record) + pages.sweep_page(ns, sweep, trials, pages.RECORD_BADGE)
        return respond(request, f"Sweep {record['name']} (record)", body, "sweeps", scripts=CHARTS)
    if section == "environments":
        env = recorded.record_object(record)
        log = (record.get("logTails") or {}).get("0") or []
        body = pages.record_note(record) + pages.environment_page(env, log, "", pages.RECORD_BADGE)
        return respond(request, f"Environment {record['name']} (record)", body, section)
    found = await _record_metrics(request, record)
    uid = str(record["uid"])
    archive = await read(request, _source(request).archive, ns, str(record["name"]), uid)
    # The registry says whose its archive is; where it cannot (no owner recorded), the
    # live run or a later record of the name tells.
    why = "" if archive.owner == uid else await _archive_elsewhere(request, record, live)
    if why:
        found.note = why
    else:
        found.files, found.note = archive.files, archive.note
    body = pages.record_page(ns, record, found)
    return respond(request, f"Run {record['name']} (record)", body, "runs", scripts=CHARTS)


async def _archive_elsewhere(request: web.Request, record: Any, live: Obj | None) -> str:
    """Why the archive under the record's name is not its run's ('' when it is): a run's
    archive is kept by name, so a later run of that name (live, or recorded after it)
    writes there."""
    ns, name = ns_of(request), str(record["name"])
    src = _source(request)
    try:
        if live is UNREAD:
            live = await read(request, src.run, ns, name)
        newest = None
        if live is None:
            newest = await read(request, src.record, ns, name, None, "TrainingRun")
    except (Refusal, Unavailable, *READ_ERRORS) as err:
        return f"cannot tell whether the archive of {name} is this run's: {_message(err)[:300]}"
    live_uid = str(live["metadata"].get("uid")) if live else None
    newest_uid = str(newest.get("uid")) if newest else None
    return recorded.archive_elsewhere(record, live_uid, newest_uid)


def _section(request: web.Request) -> str:
    return request.match_info.get("kind") or request.path.split("/")[3]


async def _record_metrics(request: web.Request, record: Any) -> Archive:
    """The record's ``metrics.jsonl``, parsed as an archive's (rank 0's, by metric)."""
    ns, name, uid = ns_of(request), str(record["name"]), str(record["uid"])
    found = Archive()
    try:
        lines = await read(request, _source(request).record_metrics, ns, name, uid)
    except Unavailable as err:
        return Archive(note=f"the record's metrics: {err}")
    add_metrics(found.metrics, "\n".join(lines))
    return found


async def archived_file(request: web.Request) -> web.StreamResponse:
    """A file of the run's archive (one its listing names), streamed from the registry
    with the caller's rights to read it (the registry's: get modelversions)."""
    ns, name = ns_of(request), name_of(request, "run name")
    queries.only(request.query, ("uid",), request.query.getall)
    rel = queries.archive_path(request.match_info["path"])
    uid = queries.uid(request.query["uid"]) if "uid" in request.query else None
    try:
        got = await read(request, _source(request).archived_file, ns, name, rel, uid)
    except Unavailable as err:
        raise Refusal(str(err), 404) from None
    try:
        response = web.StreamResponse()
        response.content_type = "application/octet-stream"
        if got.size is not None:
            response.content_length = got.size
        filename = urllib.parse.quote(rel.rsplit("/", 1)[-1], safe="")
        response.headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{filename}"
        await response.prepare(request)
        while chunk := await read(request, got.read, DOWNLOAD_CHUNK):
            await response.write(chunk)
        await response.write_eof()
    finally:
        got.close()
    return response


async def run_json(request: web.Request) -> web.Response:
    queries.only(request.query, ())
    return web.json_response(brief(await found(request, _source(request).run, "TrainingRun")))


async def log_tail(request: web.Request) -> web.Response:
    """The last ``lines`` lines of node ``node``'s log (of rank ``rank`` only, when given);
    a log the kubelet cannot give (a container not started, a Pod gone) is a note."""
    ns, name = ns_of(request), name_of(request, "run name")
    q = request.query
    queries.only(q, ("node", "rank", "lines"), q.getall)
    node = queries.integer(q, "node", 0, (0, queries.MAX_NODES))
    rank = queries.integer(q, "rank", -1, (0, queries.MAX_NODES * 1024)) if q.get("rank") else None
    lines = queries.integer(q, "lines", queries.DEFAULT_LOG_LINES, queries.LOG_LINES)
    src = _source(request)
    pods = {runs.node_rank(p): p for p in await read(request, src.pods, ns, name)}
    if node not in pods:
        return web.json_response({"lines": [], "note": f"node {node} has no Pod"})
    pod = pods[node]["metadata"]["name"]
    try:
        text = await read(request, src.log_tail, ns, pod, lines)
    except READ_ERRORS as err:
        return web.json_response({"lines": [], "note": f"{pod}: {_message(err)[:300]}"})
    if rank is not None:
        text = [line for line in text if line.startswith(f"[rank {rank}]")]
    return web.json_response({"lines": text, "pod": pod})


def _message(err: Exception) -> str:
    return str(getattr(err, "message", None) or err)


async def metric(request: web.Request) -> web.Response:
    """One metric of the run's history, cut to ``points`` by LTTB on the server."""
    ns, name = ns_of(request), name_of(request, "run name")
    q = request.query
    queries.only(q, ("name", "points"), q.getall)
    wanted = queries.metric_name(q.get("name", ""))
    points = queries.integer(q, "points", queries.DEFAULT_POINTS, queries.POINTS)
    src = _source(request)
    if "uid" in request.match_info:
        archive = await _record_metrics(request, await the_record(request, "runs"))
    else:
        run = await found(request, src.run, "TrainingRun")
        archive = await read(request, src.archive, ns, name, run["metadata"].get("uid"))
    if wanted not in archive.metrics:
        raise Refusal(f"run {name} has no metric {wanted!r}", 404)
    series = archive.metrics[wanted]
    shown = lttb.downsample(series, points)
    return web.json_response(
        {"name": wanted, "total": len(series), "points": [list(p) for p in shown]}
    )


async def act(request: web.Request) -> web.Response:
    """suspend/resume a run, cancel a sweep: a POST with the page's token (checked by
    ``csrf`` before this runs), as the caller."""
    ns, name = ns_of(request), name_of(request)
    kind, action = request.match_info["kind"], request.match_info["action"]
    allowed = RUN_ACTIONS if kind == "runs" else SWEEP_ACTIONS
    if action not in allowed:
        raise Refusal(f"no action {action!r} on {kind}; allowed: {', '.join(allowed)}", 404)
    try:
        await read(request, _source(request).act, ns, kind, name, action)
    except ValueError as err:
        raise Refusal(str(err), 409) from None
    raise web.HTTPSeeOther(html.path("ns", ns, kind, name))


async def sweep_page(request: web.Request) -> web.Response:
    ns, name = ns_of(request), name_of(request, "Sweep name")
    queries.only(request.query, ())
    got = await read(request, _source(request).sweep, ns, name)
    if got is None:
        return await record_page(request)
    sweep, trials = got
    actions = ""
    if (sweep.get("status") or {}).get("phase") not in runs.TERMINAL:
        actions = html.action_form(
            html.path("ns", ns, "sweeps", name, "cancel"),
            "Cancel",
            csrf.token(request),
            danger=True,
        )
    body = pages.sweep_page(ns, sweep, trials, actions)
    return respond(request, f"Sweep {name}", body, "sweeps", scripts=CHARTS)


async def environment_page(request: web.Request) -> web.Response:
    ns = ns_of(request)
    queries.only(request.query, ())
    src = _source(request)
    env = await read(request, src.environment, ns, name_of(request, "Environment name"))
    if env is None:
        return await record_page(request)
    job, log, note = (env.get("status") or {}).get("buildJob"), [], ""
    if job:
        try:
            log = await read(request, src.build_log, ns, job, queries.DEFAULT_LOG_LINES)
        except READ_ERRORS as err:
            note = f"build log: {_message(err)[:300]}"
    return respond(
        request,
        f"Environment {env['metadata']['name']}",
        pages.environment_page(env, log, note),
        "environments",
    )


async def endpoint_page(request: web.Request) -> web.Response:
    ns = ns_of(request)
    queries.only(request.query, ())
    got = await read(
        request, _source(request).endpoint, ns, name_of(request, "OnlineEndpoint name")
    )
    if got is None:
        raise Refusal(f"OnlineEndpoint {ns}/{request.match_info['name']} not found", 404)
    ep, pods = got
    body = endpoint_pages.endpoint_page(ep, pods)
    return respond(request, f"Endpoint {ep['metadata']['name']}", body, "endpoints")


async def endpoints_list(request: web.Request) -> web.Response:
    ns = ns_of(request)
    queries.only(request.query, ())
    items = await read(request, _source(request).endpoints, ns)
    body = endpoint_pages.endpoints_list(ns, items)
    return respond(request, f"Endpoints in {ns}", body, "endpoints")


async def queue_page(request: web.Request) -> web.Response:
    ns = ns_of(request)
    queries.only(request.query, ())
    queue = await read(request, _source(request).queue, ns)
    return respond(request, f"Queue (runs of {ns})", pages.queue_page(ns, queue), "queue")


def listing(section: str, title: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The view of a namespace's list of ``section`` (sweeps, models, environments): the
    source's method and the page's renderer of that name."""

    async def view(request: web.Request) -> web.Response:
        ns = ns_of(request)
        queries.only(request.query, ())
        items = await read(request, getattr(_source(request), section), ns)
        note = ""
        if section in recorded.KIND_OF:
            items, note = await with_records(request, section, items)
        body = getattr(pages, f"{section}_list")(ns, items, note)
        return respond(request, f"{title} in {ns}", body, section)

    return view


def routes() -> list[web.RouteDef]:
    one = "/ns/{ns}/{kind:runs|sweeps}/{name}/{action}"
    return [
        web.get("/", home),
        web.get("/login", login_page),
        web.post("/login", login),
        web.post("/logout", logout),
        web.get("/ns", open_namespace),
        web.get("/ns/{ns}/runs", runs_list),
        web.get("/ns/{ns}/runs/{name}", run_page),
        web.post(one, act),
        web.get("/ns/{ns}/sweeps", listing("sweeps", "Sweeps")),
        web.get("/ns/{ns}/sweeps/{name}", sweep_page),
        web.get("/ns/{ns}/models", listing("models", "Models")),
        web.get("/ns/{ns}/environments", listing("environments", "Environments")),
        web.get("/ns/{ns}/environments/{name}", environment_page),
        web.get("/ns/{ns}/endpoints", endpoints_list),
        web.get("/ns/{ns}/endpoints/{name}", endpoint_page),
        web.get("/ns/{ns}/queue", queue_page),
        web.get("/api/ns/{ns}/runs", runs_json),
        web.get("/api/ns/{ns}/runs/{name}", run_json),
        web.get("/api/ns/{ns}/runs/{name}/log", log_tail),
        web.get("/api/ns/{ns}/runs/{name}/metrics", metric),
        web.get("/ns/{ns}/runs/{name}/files/{path:.+}", archived_file),
        web.get("/ns/{ns}/{kind:runs|sweeps|environments}/{name}/records/{uid}", record_page),
        web.get("/api/ns/{ns}/runs/{name}/records/{uid}/metrics", metric),
    ]

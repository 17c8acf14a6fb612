"""Each page of the web view as HTML, from what its view read (pure: no I/O, no clock but
the ages the CLI shows too). What the CLI computes is reused, not computed again: the
state of a node Pod, the failure's text, progress and durations (``sdk.runs``), a
sweep's trials and summary (``sdk.sweeps``), a Queued run's reason (``web.source``).

Called by ``torchyard.web.views``; tested in tests/unit/web/test_pages.py and in a real
browser in tests/integration/web/.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from torchyard.api.trainingrun_status import QUEUE_EXACT_POSITIONS
from torchyard.api.wire import LABEL_EXPERIMENT
from torchyard.records import Record
from torchyard.registry.store import human_size
from torchyard.sdk import runs
from torchyard.sdk import sweeps as sweep_sdk
from torchyard.web import queries, recorded, source
from torchyard.web.html import Markup, badge, e, link, path, pre, section, table, with_query

Obj = dict[str, Any]
EVENTS_SHOWN = 50
RECORD_BADGE = '<span class="badge gone" data-deleted="1">record</span>'
FILES_SHOWN = 500  # of a run's archive (a page stays small; each is a download)


def runs_list(
    ns: str, items: list[Obj], total: int, filt: queries.RunFilter, note: str = ""
) -> str:
    rows = [
        [
            _name_link(ns, "runs", r),
            Markup(
                f'<span data-phase="{e(r["metadata"]["name"])}">{badge(_phase(r))}</span>'
                + _record_mark(r)
            ),
            (r.get("metadata", {}).get("labels") or {}).get(LABEL_EXPERIMENT, "-"),
            ((r.get("status") or {}).get("nodes") or {}).get("ready", "0/0"),
            runs.progress_text((r.get("status") or {}).get("progress")) or "-",
            ((r.get("status") or {}).get("progress") or {}).get("eta") or "-",
            runs.duration(runs.elapsed(r)),
            r["metadata"].get("creationTimestamp", ""),
        ]
        for r in items
    ]
    head = ["Name", "Phase", "Experiment", "Ready", "Progress", "ETA", "Elapsed", "Created"]
    shown = f"{len(items)} of {total} run(s)" if total else "no runs match"
    return (
        _filters(ns, filt)
        + _note(note)
        + f'<p class="count" aria-live="polite">{e(shown)}</p>'
        + str(table(head, rows, caption="TrainingRuns", id="runs", data_refresh="runs"))
        + _pager(ns, filt, total)
    )


def _filters(ns: str, filt: queries.RunFilter) -> str:
    options = "".join(
        f'<option value="{e(p)}"{" selected" if p == filt.phase else ""}>{e(p or "any")}</option>'
        for p in ("", *queries.PHASES)
    )
    return f"""<form class="filters" method="get" action="{e(path("ns", ns, "runs"))}">
<label for="f-phase">Phase</label><select id="f-phase" name="phase">{options}</select>
<label for="f-experiment">Experiment</label>
<input id="f-experiment" name="experiment" value="{e(filt.experiment)}" maxlength="63">
<label for="f-label">Label</label>
<input id="f-label" name="label" value="{e(filt.label)}" placeholder="key=value" maxlength="317">
<label for="f-since">Created within</label>
<input id="f-since" name="since" value="{e(filt.since)}" placeholder="6h" maxlength="6" size="6">
<label for="f-size">Per page</label>
<input id="f-size" name="size" type="number" min="1" max="{queries.PAGE_SIZES[1]}"
 value="{filt.size}">
<button type="submit">Filter</button></form>"""


def _pager(ns: str, filt: queries.RunFilter, total: int) -> str:
    base = path("ns", ns, "runs")
    pages = max(1, -(-total // filt.size))
    parts = []
    if filt.page > 1:
        parts.append(link(with_query(base, filt.query(page=filt.page - 1)), "Previous", rel="prev"))
    parts.append(Markup(f"<span>page {filt.page} of {pages}</span>"))
    if filt.page < pages:
        parts.append(link(with_query(base, filt.query(page=filt.page + 1)), "Next", rel="next"))
    return '<nav class="pager" aria-label="Pages">' + " ".join(map(str, parts)) + "</nav>"


def _name_link(ns: str, section: str, obj: Obj) -> Markup:
    """The object's page: its record's (by uid) when only the record is left."""
    name, mark = obj["metadata"]["name"], recorded.mark(obj)
    if mark and mark.get("deleted") and mark.get("uid"):
        return link(path("ns", ns, section, name, "records", str(mark["uid"])), name)
    return link(path("ns", ns, section, name), name)


def _record_mark(obj: Obj) -> str:
    """ "deleted" for what only a record is left of, "recorded" for a live one recorded."""
    mark = recorded.mark(obj)
    if not mark:
        return ""
    if mark.get("deleted"):
        tip = "deleted: shown from its record"
        return f' <span class="badge gone" title="{tip}" data-deleted="1">deleted</span>'
    return ' <span class="badge gone" title="its record is kept">recorded</span>'


def tensorboard_hint(ns: str, name: str, *, sweep: bool = False) -> str:
    """The command that serves the run's (or the sweep's trials') TensorBoard event files
    on the reader's own machine (``torchyard tensorboard``: a local process, not a page of
    this view)."""
    target = f"--sweep {name}" if sweep else name
    command = f"torchyard tensorboard {target} -n {ns}"
    return (
        f'<p class="hint" data-tensorboard="{e(command)}">TensorBoard (the event files the '
        f"scripts wrote to $TORCHYARD_TENSORBOARD_DIR): <code>{e(command)}</code></p>"
    )


def _note(note: str) -> str:
    return f'<p class="note" role="note">{e(note)}</p>' if note else ""


def _phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def run_page(
    ns: str, run: Obj, pods: list[Obj], events: list[Obj], archive: source.Archive, actions: str
) -> str:
    name = run["metadata"]["name"]
    st = run.get("status") or {}
    parts = [
        f'<div class="head" data-run="{e(name)}">'
        f'<span data-phase="{e(name)}">{badge(_phase(run))}</span>{actions}</div>',
        _summary(run),
        section("Phase timeline", _timeline(run), ident="timeline"),
        section("Nodes", _nodes(pods), ident="nodes"),
    ]
    if st.get("failure") or st.get("lastFailure"):
        parts.append(
            section("Failure", _failure(st.get("failure") or st["lastFailure"]), ident="failure")
        )
    if archive.stacks:
        parts.append(section("Stacks (hang)", _stacks(archive.stacks), ident="stacks"))
    charts, logs = _charts(ns, name, archive), _logs(ns, name, run, pods)
    return "\n".join(parts + _the_rest(ns, run, archive, charts, logs, events, ""))


def _the_rest(
    ns: str,
    run: Obj,
    archive: source.Archive,
    charts: Markup,
    logs: Markup,
    events: list[Obj],
    spec_open: str,
) -> list[str]:
    """The sections a run's page and a record's page share, after the failure."""
    spec = yaml.safe_dump(run.get("spec") or {}, sort_keys=True)
    return [
        section(
            "Metrics",
            Markup(str(charts) + tensorboard_hint(ns, run["metadata"]["name"])),
            ident="metrics",
        ),
        section("Logs", logs, ident="logs"),
        section("Events", _events(events), ident="events"),
        section("Outputs and model", _outputs(ns, run, archive), ident="outputs"),
        section(
            "Spec",
            Markup(f"<details{spec_open}><summary>spec (YAML)</summary>{pre(spec)}</details>"),
            ident="spec",
        ),
    ]


def record_page(ns: str, record: Record, archive: source.Archive) -> str:
    """A TrainingRun's record (the run is gone, or the page names this one record): what
    the run page shows of a live run, from the record; its metrics from the record's
    ``metrics.jsonl``, its logs the tails kept when it ended."""
    run = recorded.record_object(record)
    name, uid = str(record.get("name")), str(record.get("uid"))
    st = run["status"]
    parts = [
        f'<div class="head" data-run="{e(name)}">{badge(_phase(run))} {RECORD_BADGE}</div>',
        record_note(record),
        _summary(run),
        section("Phase timeline", _timeline(run), ident="timeline"),
        section("Nodes", _recorded_nodes(record.get("nodes") or []), ident="nodes"),
    ]
    failure = record.get("failure") or st.get("failure") or st.get("lastFailure")
    if failure:
        parts.append(section("Failure", _failure(failure), ident="failure"))
    url = path("api", "ns", ns, "runs", name, "records", uid, "metrics")
    charts = _charts(ns, name, archive, url)
    logs = _log_tails(record.get("logTails") or {})
    events = recorded.events(record)
    return "\n".join(parts + _the_rest(ns, run, archive, charts, logs, events, " open"))


def record_note(record: Record) -> str:
    """What a record's page says first: that it shows a record, of which uid, when kept,
    and whether the object was deleted before it ended (its phase then is the last one)."""
    deleted = (
        " It was deleted before it ended: its phase is the last one seen."
        if (record.get("deleted"))
        else ""
    )
    return (
        f'<p class="note" role="note">Shown from the record kept when it ended '
        f"(uid {e(record.get('uid'))}, recorded {e(record.get('recorded') or '-')}).{deleted}</p>"
    )


def _recorded_nodes(nodes: Sequence[Mapping[str, Any]]) -> Markup:
    rows = [
        [
            n.get("node"),
            n.get("pod") or "-",
            n.get("reason") or n.get("phase") or "-",
            n.get("restarts") or 0,
            n.get("nodeName") or "-",
            "-" if n.get("exitCode") is None else n.get("exitCode"),
        ]
        for n in nodes
    ]
    head = ["Node rank", "Pod", "State", "Restarts", "Node", "Exit"]
    return table(head, rows, caption="Node Pods (as they ended)")


def _log_tails(tails: dict[str, list[str]]) -> Markup:
    if not tails:
        return Markup('<p class="none">no log tails were kept</p>')
    return Markup(
        "".join(
            f"<details open><summary>node {e(node)}: the last {len(lines)} line(s)</summary>"
            + str(
                pre(
                    "\n".join(lines), class_="log", tabindex="0", aria_label=f"node {node} log tail"
                )
            )
            + "</details>"
            for node, lines in sorted(
                tails.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0
            )
        )
    )


def _summary(run: Obj) -> str:
    st, spec = run.get("status") or {}, run.get("spec") or {}
    dist = spec.get("distribution") or {}
    progress = st.get("progress") or {}
    rows: list[tuple[str, object]] = [
        ("Environment", spec.get("environment", "-")),
        ("Command", " ".join(map(str, spec.get("command") or [])) or "-"),
        (
            "Distribution",
            f"{dist.get('nodeCount', 1)} node(s) x "
            f"{dist.get('processCountPerNode', 1)} process(es)",
        ),
        ("Elapsed", runs.duration(runs.elapsed(run))),
        ("Restarts", runs.restarts_text(st)),
        ("Progress", runs.progress_text(progress) or "-"),
        ("ETA", progress.get("eta") or "-"),
    ]
    if st.get("lastInPlaceRestart"):
        rows.append(("Last in-place restart", st["lastInPlaceRestart"].get("message", "")))
    queue = st.get("queue") or {}
    if queue:
        place = queue.get("position") or f"beyond the first {QUEUE_EXACT_POSITIONS}"
        where = f"{place} in pool {queue.get('pool') or '(default)'}"
        rows += [("Queue", where), ("Waiting because", source.waiting_reason(run))]
    body = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows)
    bar = ""
    if isinstance(progress.get("percent"), int):
        done = progress["percent"]
        bar = f'<progress max="100" value="{done}" aria-label="progress">{done}%</progress>'
    return f'<dl class="summary">{body}</dl>{bar}'


def _timeline(run: Obj) -> Markup:
    st = run.get("status") or {}
    marks = [(run["metadata"].get("creationTimestamp"), "Created", "")]
    marks += [(st.get("startTime"), "Started", "")]
    for c in st.get("conditions") or []:
        if c.get("status") == "True" or c.get("type") == "Admitted":
            marks.append(
                (
                    c.get("lastTransitionTime"),
                    f"{c.get('type')}={c.get('status')}",
                    f"{c.get('reason', '')}: {c.get('message', '')}",
                )
            )
    marks += [(st.get("completionTime"), "Finished", _phase(run))]
    items = "".join(
        f'<li><time datetime="{e(t)}">{e(t)}</time> <strong>{e(what)}</strong> {e(why)}</li>'
        for t, what, why in sorted((m for m in marks if m[0]), key=lambda m: str(m[0]))
    )
    return Markup(f'<ol class="timeline">{items}</ol>')


def _nodes(pods: list[Obj]) -> Markup:
    rows = []
    for pod in pods:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
        exits = [
            str(c["state"]["terminated"].get("exitCode"))
            for c in statuses
            if (c.get("state") or {}).get("terminated")
        ]
        rows.append(
            [
                runs.node_rank(pod),
                pod["metadata"]["name"],
                runs.pod_state(pod),
                restarts,
                pod["spec"].get("nodeName") or "-",
                ", ".join(exits) or "-",
            ]
        )
    return table(
        ["Node rank", "Pod", "State", "Restarts", "Node", "Exit"], rows, caption="Node Pods"
    )


def _failure(failure: Mapping[str, Any]) -> Markup:
    rows = [
        ("Class", failure.get("class")),
        ("Rank", failure.get("rank")),
        ("Node rank", failure.get("node")),
        ("Node", failure.get("nodeName")),
        ("Pod", failure.get("pod")),
        (
            "Exit",
            f"signal {failure['signal']}" if failure.get("signal") else failure.get("exitCode"),
        ),
        ("Reason", failure.get("reason")),
        ("Exception", failure.get("exception")),
        ("Model version", failure.get("version")),
        ("Restarts", failure.get("restarts")),
        ("Retryable", failure.get("retryable")),
        ("Step", failure.get("step")),
    ]
    body = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows if v is not None)
    advice = (
        f'<p class="advice"><strong>Advice:</strong> {e(failure["advice"])}</p>'
        if failure.get("advice")
        else ""
    )
    trace = pre(failure.get("message") or "", class_="traceback", aria_label="traceback")
    return Markup(f'<dl class="summary">{body}</dl>{advice}{trace}')


def _stacks(stacks: dict[str, str]) -> Markup:
    return Markup(
        "".join(
            f"<details open><summary>{e(where)}</summary>{pre(text)}</details>"
            for where, text in sorted(stacks.items())
        )
    )


def _charts(ns: str, name: str, archive: source.Archive, url: str = "") -> Markup:
    if not archive.metrics:
        return Markup(
            '<p class="none">no metrics history'
            + (f": {e(archive.note)}" if archive.note else "")
            + "</p>"
        )
    url = url or path("api", "ns", ns, "runs", name, "metrics")
    charts = "".join(
        f'<figure class="chart" data-metric-url="{e(with_query(url, {"name": m}))}">'
        f"<figcaption>{e(m)}</figcaption></figure>"
        for m in sorted(archive.metrics)
    )
    return Markup(charts)


def _logs(ns: str, name: str, run: Obj, pods: list[Obj]) -> Markup:
    nodes = sorted({runs.node_rank(p) for p in pods})
    if not nodes:
        return Markup('<p class="none">no node Pods (yet, or any more)</p>')
    per_node = int(
        ((run.get("spec") or {}).get("distribution") or {}).get("processCountPerNode") or 1
    )
    node_opts = "".join(f'<option value="{n}">node {n}</option>' for n in nodes)
    rank_opts = '<option value="">all ranks</option>' + "".join(
        f'<option value="{r}">rank {r}</option>'
        for r in range(min(per_node * (max(nodes) + 1), 1024))
    )
    url = path("api", "ns", ns, "runs", name, "log")
    return Markup(
        f'<div class="logbar" data-log-url="{e(url)}"><label for="log-node">Node</label>'
        f'<select id="log-node">{node_opts}</select><label for="log-rank">Rank</label>'
        f'<select id="log-rank">{rank_opts}</select>'
        '<label><input type="checkbox" id="log-follow" checked> Follow</label></div>'
        '<pre id="log" class="log" tabindex="0" aria-live="polite" aria-label="log tail"></pre>'
    )


def _events(events: list[Obj]) -> Markup:
    rows = [
        [
            ev.get("lastTimestamp") or ev.get("eventTime") or "",
            ev.get("type", ""),
            ev.get("reason", ""),
            ev.get("message", ""),
        ]
        for ev in events[-EVENTS_SHOWN:]
    ]
    return table(["Time", "Type", "Reason", "Message"], rows, caption="Events about the run")


def _outputs(ns: str, run: Obj, archive: source.Archive) -> Markup:
    """The ModelVersion the run made and its archive's files (outputs first), each with
    its size and a download through the registry (``views.archived_file``)."""
    model = (run.get("status") or {}).get("model")
    shown = ""
    if model:
        label = f"{model.get('name')} version {model.get('version')}"
        href = path("ns", ns, "models") + "#model-" + str(model.get("name"))
        shown = f"<p>Model version: {link(href, label)}</p>"
    name, uid = run["metadata"]["name"], run["metadata"].get("uid") or ""
    rows = [
        [
            link(
                with_query(path("ns", ns, "runs", name, "files", *f.path.split("/")), {"uid": uid}),
                f.path,
                download="",
            ),
            "-" if f.size is None else human_size(f.size),
        ]
        for f in archive.files[:FILES_SHOWN]
    ]
    if rows:
        more = len(archive.files) - len(rows)
        caption = f"Archived files ({len(archive.files)})" + (
            f", the first {len(rows)} shown" if more > 0 else ""
        )
        shown += str(table(["File", "Size"], rows, caption=caption, id="files"))
    if archive.note:
        shown += f'<p class="none">archived files: {e(archive.note)}</p>'
    return Markup(shown or '<p class="none">none</p>')


def sweeps_list(ns: str, items: list[Obj], note: str = "") -> str:
    rows = [
        [
            _name_link(ns, "sweeps", s),
            Markup(f"{badge(_phase(s))}{_record_mark(s)}"),
            sweep_sdk.summary_line(s),
        ]
        for s in items
    ]
    return _note(note) + str(table(["Name", "Phase", "Trials"], rows, caption="Sweeps"))


def sweep_page(ns: str, sweep: Obj, trials: list[sweep_sdk.Trial], actions: str) -> str:
    objective = sweep["spec"]["objective"]
    ranked = sweep_sdk.ranked(trials, objective["goal"])
    best = sweep_sdk.best(sweep, trials)
    params = sorted({k for t in trials for k in t.parameters})
    rows = [
        [
            link(path("ns", ns, "runs", t.name), t.name),
            t.index,
            badge(t.state),
            *[t.parameters.get(p, "") for p in params],
            "-" if t.best is None else f"{t.best:.6g}",
            len(t.history),
            t.reason,
        ]
        for t in ranked
    ]
    head = [
        "Trial",
        "Index",
        "State",
        *params,
        f"best {objective['metric']}",
        "Intervals",
        "Reason",
    ]
    curves = {t.name: [v for v in t.history] for t in trials if t.history}
    stopped = [t.name for t in trials if t.state == "Stopped"]
    paused = [t.name for t in trials if t.state == "Paused"]
    data = json.dumps(
        {
            "metric": objective["metric"],
            "curves": curves,
            "stopped": stopped,
            "paused": paused,
            "best": best.name if best else None,
        }
    )
    best_text = (
        f"best: {sweep_sdk.best_name({'name': best.name, 'state': best.state})} "
        f"({objective['metric']} {best.best:.6g}, {objective['goal']})"
        if best
        else "no metric reported yet"
    )
    return (
        f'<div class="head">{badge(_phase(sweep))}{actions}</div>'
        f'<p class="best">{e(sweep_sdk.summary_line(sweep))}</p>'
        f"<p><strong>{e(best_text)}</strong></p>"
        + section(
            "Metric by interval",
            Markup(
                f'<figure class="chart" id="sweep-chart" data-curves="{e(data)}">'
                f"<figcaption>{e(objective['metric'])} of every trial (stopped trials "
                "dashed, paused ones dotted, the best one bold)</figcaption></figure>"
            ),
            ident="curves",
        )
        + tensorboard_hint(ns, sweep["metadata"]["name"], sweep=True)
        + section("Trials", table(head, rows, caption="Trials, best first"), ident="trials")
        + section("Conditions", _conditions(sweep), ident="conditions")
    )


def _conditions(obj: Obj) -> Markup:
    """An object's status conditions (why its trials wait, how it finished) as a table."""
    found = (obj.get("status") or {}).get("conditions") or []
    rows = [
        [c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("message", "")]
        for c in found
    ]
    return table(["Type", "Status", "Reason", "Message"], rows, caption="Conditions")


def models_list(ns: str, items: list[Obj], note: str = "") -> str:
    rows: list[list[object]] = []
    seen: set[str] = set()
    for m in sorted(
        items,
        key=lambda m: (
            str((m.get("spec") or {}).get("model")),
            -int((m.get("spec") or {}).get("version") or 0),
        ),
    ):
        spec, st = m.get("spec") or {}, m.get("status") or {}
        run = (spec.get("run") or {}).get("name")
        files = spec.get("files") or st.get("files") or []
        listing = "; ".join(
            f"{f.get('path')} sha256:{str(f.get('sha256', ''))[:12]}"
            for f in files
            if isinstance(f, dict)
        )
        rows.append(
            [
                _anchor(spec.get("model"), seen),
                spec.get("version"),
                link(path("ns", ns, "runs", run), run) if run else "-",
                st.get("size") or spec.get("size") or "-",
                listing or "-",
                m["metadata"].get("creationTimestamp", ""),
            ]
        )
    return _note(note) + str(
        table(
            ["Model", "Version", "From run", "Size", "Files", "Created"],
            rows,
            caption="Model versions",
        )
    )


def _anchor(model: object, seen: set[str]) -> Markup:
    """The model's name; its first row (its newest version) is the anchor runs link to."""
    if str(model) in seen:
        return Markup(e(model))
    seen.add(str(model))
    return Markup(f'<span id="model-{e(model)}">{e(model)}</span>')


def environments_list(ns: str, items: list[Obj], note: str = "") -> str:
    rows = [
        [
            _name_link(ns, "environments", x),
            Markup(f"{badge(_phase(x))}{_record_mark(x)}"),
            (x.get("status") or {}).get("image") or "-",
        ]
        for x in items
    ]
    head = ["Name", "Phase", "Image (digest)"]
    return _note(note) + str(table(head, rows, caption="Environments"))


def environment_page(env: Obj, log: list[str], note: str, mark: str = "") -> str:
    st = env.get("status") or {}
    rows = [
        ("Image", st.get("image") or "-"),
        ("Hash", st.get("hash") or "-"),
        ("Build Job", st.get("buildJob") or "-"),
    ]
    body = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows)
    text = "\n".join(log) or st.get("message") or note or "no build log"
    spec = yaml.safe_dump(env.get("spec") or {}, sort_keys=True)
    return (
        f'<div class="head">{badge(_phase(env))} {mark}</div><dl class="summary">{body}</dl>'
        + section(
            "Build log",
            pre(text, class_="log", tabindex="0", aria_label="build log"),
            ident="build",
        )
        + section("Spec", pre(spec), ident="spec")
    )


def queue_page(ns: str, queue: source.Queue) -> str:
    pool_rows = [
        [
            p["pool"] or "(no pool label)",
            f"{p['ready']}/{p['nodes']}",
            _room(p["total"]),
            _room(p["free"]),
            p.get("waiting", 0),
        ]
        for p in queue.pools
    ]
    waiting = [
        [
            link(path("ns", ns, "runs", r["metadata"]["name"]), r["metadata"]["name"]),
            (r["status"].get("queue") or {}).get("pool") or "(default)",
            (r["status"].get("queue") or {}).get("position") or ">50",
            source.waiting_reason(r),
        ]
        for r in queue.waiting
    ]
    note = f'<p class="note" role="note">{e(queue.note)}</p>' if queue.note else ""
    return (
        note
        + section(
            "Pools",
            table(
                ["Pool", "Ready nodes", "Capacity", "Free now", "Waiting"],
                pool_rows,
                caption="Pools and their room",
            ),
            ident="pools",
        )
        + section(
            "Waiting gangs",
            table(
                ["Run", "Pool", "Place", "Why it waits"],
                waiting,
                caption="Queued runs, by pool and place",
            ),
            ident="waiting",
        )
    )


def _room(room: dict[str, Any]) -> str:
    """``32 GPU, 384 cpu, 4096Gi memory, 440 pods`` of a pool's allocatable or free room."""
    shown = []
    for key, unit in (
        ("nvidia.com/gpu", "GPU"),
        ("cpu", "cpu"),
        ("memory", "memory"),
        ("pods", "pods"),
    ):
        if key in room:
            value = float(room[key]) / (2**30 if key == "memory" else 1)
            number = f"{value:.0f}" if value == int(value) or value >= 10 else f"{value:.1f}"
            shown.append(f"{number}{'Gi' if key == 'memory' else ''} {unit}")
    return ", ".join(shown) or "-"


# The renderers other page modules share (``endpoint_pages``).
name_link = _name_link
phase_of = _phase
note_of = _note
failure_of = _failure

"""The web view's pages of OnlineEndpoints: the namespace's list (phase, model version,
ready Pods, scoring URI) and one endpoint's page (its versions' shares, a failing Pod's
class, advice and traceback, its Pods, its spec), over the renderers of ``pages``.
Called by ``views``; tested in tests/unit/web/test_app.py.
"""

from __future__ import annotations

from typing import Any

import yaml

from torchyard.api.wire import LABEL_MODEL_VERSION
from torchyard.web import pages
from torchyard.web.html import badge, e, pre, section, table

Obj = dict[str, Any]


def endpoints_list(ns: str, items: list[Obj], note: str = "") -> str:
    rows = []
    for x in items:
        st = x.get("status") or {}
        model = st.get("model") or {}
        rows.append(
            [
                pages.name_link(ns, "endpoints", x),
                badge(pages.phase_of(x)),
                f"{model.get('name', '-')} v{model.get('version', '-')}" if model else "-",
                f"{st.get('readyReplicas', 0)}/{st.get('replicas', 0)}",
                st.get("scoringUri") or "-",
            ]
        )
    head = ["Name", "Phase", "Model", "Ready", "Scoring URI"]
    return pages.note_of(note) + str(table(head, rows, caption="Endpoints"))


def endpoint_page(ep: Obj, pods: list[Obj]) -> str:
    """An endpoint: what it serves, its versions' shares, why a Pod fails, its Pods."""
    st = ep.get("status") or {}
    model = st.get("model") or {}
    rows = [
        ("Model", f"{model.get('name', '-')} version {model.get('version', '-')}"),
        ("Scoring URI", st.get("scoringUri") or "-"),
        ("Ready", f"{st.get('readyReplicas', 0)}/{st.get('replicas', 0)} Pods"),
        ("Access", "public" if (ep.get("spec") or {}).get("public") else "a token that may get it"),
        ("Message", st.get("message") or "-"),
    ]
    body = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows)
    versions = [
        [
            v["version"],
            f"{v['percent']}%",
            v["deployment"],
            f"{v.get('readyReplicas', 0)}/{v.get('replicas', 0)}",
        ]
        for v in st.get("versions") or []
    ]
    out = f'<div class="head">{badge(pages.phase_of(ep))}</div><dl class="summary">{body}</dl>'
    out += section(
        "Versions",
        table(["Version", "Share", "Deployment", "Ready"], versions, caption="Versions"),
        ident="versions",
    )
    failure = st.get("failure")
    if failure:
        out += section("Failure", pages.failure_of(failure), ident="failure")
    pod_rows = [
        [
            p["metadata"]["name"],
            (p["metadata"].get("labels") or {}).get(LABEL_MODEL_VERSION, "-"),
            (p.get("status") or {}).get("phase") or "-",
            sum(
                int(c.get("restartCount") or 0)
                for c in (p.get("status") or {}).get("containerStatuses") or []
            ),
        ]
        for p in pods
    ]
    out += section(
        "Pods",
        table(["Pod", "Version", "Phase", "Restarts"], pod_rows, caption="Pods"),
        ident="pods",
    )
    spec = yaml.safe_dump(ep.get("spec") or {}, sort_keys=True)
    return out + section("Spec", pre(spec), ident="spec")

"""The web view's markup: escaping, the page frame (navigation, namespace, skip link),
tables, and small parts the pages share. Every value that came from the cluster goes
through :func:`e` (or :func:`table`, which escapes its cells); nothing is marked safe
but the markup built here.

Pure; called by ``torchyard.web.pages``. Tested in tests/unit/web/.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

# The sections of the navigation: (path under /ns/<namespace>/, label)
SECTIONS = (
    ("runs", "Runs"),
    ("sweeps", "Sweeps"),
    ("models", "Models"),
    ("environments", "Environments"),
    ("endpoints", "Endpoints"),
    ("queue", "Queue"),
)
PHASE_CLASSES = {
    "Succeeded": "ok",
    "Ready": "ok",
    "Completed": "ok",
    "Failed": "bad",
    "Running": "run",
    "Queued": "wait",
    "Pending": "wait",
    "Preparing": "wait",
    "Finalizing": "run",
    "Canceled": "bad",
    "Suspended": "wait",
    "Stopped": "wait",
    "Paused": "wait",
}


@dataclass(frozen=True)
class Markup:
    """HTML built here: inserted as it is (everything else is escaped)."""

    text: str

    def __str__(self) -> str:
        return self.text


def e(value: object) -> str:
    """``value`` as text inside HTML (quotes too: safe in attributes)."""
    if isinstance(value, Markup):
        return value.text
    return html.escape("" if value is None else str(value), quote=True)


def attributes(attrs: dict[str, str]) -> str:
    """HTML attributes of keyword arguments: ``aria_label`` is ``aria-label``, ``class_``
    is ``class`` (a Python keyword)."""
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{e(v)}"' for k, v in attrs.items())


def link(href: str, text: object, **attrs: str) -> Markup:
    extra = attributes(attrs)
    return Markup(f'<a href="{e(href)}"{extra}>{e(text)}</a>')


def path(*parts: str) -> str:
    """A URL path of ``parts``, each percent-encoded."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


def with_query(base: str, query: dict[str, str | int]) -> str:
    kept = {k: v for k, v in query.items() if v not in ("", None)}
    return f"{base}?{urlencode(kept)}" if kept else base


def badge(phase: object) -> Markup:
    text = str(phase or "Pending")
    return Markup(f'<span class="badge {PHASE_CLASSES.get(text, "")}">{e(text)}</span>')


def table(
    head: Sequence[str], rows: Iterable[Sequence[object]], *, caption: str, **attrs: str
) -> Markup:
    """A table with a caption (its accessible name), a header row and escaped cells."""
    extra = attributes(attrs)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>\n" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(head)}" class="none">none</td></tr>'
    cols = "".join(f'<th scope="col">{e(h)}</th>' for h in head)
    return Markup(
        f"<table{extra}><caption>{e(caption)}</caption><thead><tr>{cols}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def section(title: str, body: object, *, ident: str) -> str:
    head = f'<h2 id="h-{e(ident)}">{e(title)}</h2>'
    return f'<section aria-labelledby="h-{e(ident)}">{head}{e(body)}</section>'


def pre(text: object, **attrs: str) -> Markup:
    extra = attributes(attrs)
    return Markup(f"<pre{extra}>{e(text)}</pre>")


def page(
    title: str,
    body: str,
    *,
    namespace: str,
    current: str,
    token: str,
    scripts: Sequence[str] = (),
    signed_in: bool = False,
) -> str:
    """The whole document: head (assets shipped with the package), the navigation with
    the namespace form (and Sign out, in the cluster), and ``body`` in ``<main>``."""
    nav = "".join(
        f'<li><a href="{e(path("ns", namespace, key))}"'
        + (' aria-current="page"' if key == current else "")
        + f">{e(label)}</a></li>"
        for key, label in SECTIONS
    )
    sign_out = action_form("/logout", "Sign out", token) if signed_in else ""
    script_tags = "".join(f'<script src="/static/{e(s)}" defer></script>' for s in scripts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="torchyard-token" content="{e(token)}">
<title>{e(title)} · torchyard</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/uplot.min.css">
<link rel="stylesheet" href="/static/app.css">{script_tags}
</head><body>
<a class="skip" href="#main">Skip to content</a>
<header><nav aria-label="Sections"><span class="brand">torchyard</span><ul>{nav}</ul></nav>
<form class="ns" method="get" action="/ns">
<label for="ns-input">Namespace</label>
<input id="ns-input" name="namespace" value="{e(namespace)}" required maxlength="63"
 pattern="[a-z0-9]([-a-z0-9]*[a-z0-9])?" autocomplete="off">
<button type="submit">Open</button></form>{sign_out}</header>
<main id="main" tabindex="-1"><h1>{e(title)}</h1>
{body}
</main></body></html>
"""


def action_form(href: str, label: str, token: str, *, danger: bool = False) -> str:
    """A button that POSTs to ``href`` with the page's token (the only way to change
    anything, as the caller)."""
    cls = ' class="danger"' if danger else ""
    return (
        f'<form method="post" action="{e(href)}" class="action">'
        f'<input type="hidden" name="token" value="{e(token)}">'
        f'<button type="submit"{cls}>{e(label)}</button></form>'
    )


def error_page(status: int, message: str, *, namespace: str, token: str) -> str:
    body = f'<p class="refusal" role="alert"><strong>{status}</strong> {e(message)}</p>'
    return page(f"Error {status}", body, namespace=namespace, current="", token=token)


def login_form(token: str) -> str:
    """Paste a Kubernetes token once: it stays in this browser (a cookie the page's scripts
    cannot read), never on the server."""
    return f"""<form method="post" action="/login" class="login">
<input type="hidden" name="token" value="{e(token)}">
<p><label for="k8s-token">Kubernetes token</label></p>
<textarea id="k8s-token" name="k8s_token" rows="4" cols="80" required
 autocomplete="off" spellcheck="false"></textarea>
<p class="count">e.g. <code>kubectl create token NAME -n NAMESPACE</code>; every page then
shows only what this identity may read (SubjectAccessReview).</p>
<button type="submit">Sign in</button></form>"""

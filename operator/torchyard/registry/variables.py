"""What the registry service's route variables may hold, checked in one place.

:data:`VARIABLES` gives every path variable of every route (``{ns}``, ``{run}``,
``{model}``, ``{v}``, ``{kind}``, ``{sha}``, ``{path}``, and the records' ``{kinds}``,
``{name}``, ``{uid}``) a rule; the middleware
:func:`checked_variables` answers 400 naming the variable and its rule before any handler
reads one, and ``service.create_app`` refuses to start when a route has a variable with no
rule (:func:`unruled`). :func:`path_problem` is the rule of a file path inside a folder,
also applied by ``versions`` to the path in a promotion's body.

Used by ``registry.service`` and ``registry.versions``; tested in
``tests/unit/registry/test_service.py`` (the rules, the hostile table of ``hostile.py``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from torchyard.registry.store import TMP_PREFIX

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_PATH = 1024  # characters of a file path
MAX_SEGMENT = 255  # bytes of one of its names (what a filesystem takes)


def path_problem(value: str) -> str | None:
    """Why ``value`` is not a file path inside a folder (None when it is): it must be
    relative, with no empty, ``.`` or ``..`` names, no backslash, NUL or control
    character, no name of the registry's own temporaries, and not too long."""
    if not value:
        return "it is empty"
    if len(value) > MAX_PATH:
        return f"it is longer than {MAX_PATH} characters"
    if value.startswith("/"):
        return "it is absolute: give a path relative to the folder"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not UTF-8"
    if any(c == "\\" or ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a backslash, a NUL or another control character"
    for name in value.split("/"):
        if name in ("", ".", ".."):
            return "it has an empty, '.' or '..' name"
        if len(name.encode()) > MAX_SEGMENT:
            return f"one of its names is longer than {MAX_SEGMENT} bytes"
        if name.startswith(TMP_PREFIX):
            return f"names starting with {TMP_PREFIX} are the registry's own"
    return None


def _pattern(regex: str | re.Pattern[str], rule: str) -> Callable[[str], str | None]:
    compiled = re.compile(regex)
    return lambda value: None if compiled.fullmatch(value) else rule


_LABEL_RULE = "a DNS-1123 label: at most 63 of a-z, 0-9 and '-', starting and ending alphanumeric"
# Route variable -> (what it is, why a value is refused or None). create_app refuses a
# route with a variable missing here.
VARIABLES: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "ns": ("namespace", _pattern(DNS_LABEL, _LABEL_RULE)),
    "run": ("run", _pattern(DNS_LABEL, _LABEL_RULE)),
    "model": ("model", _pattern(DNS_LABEL, _LABEL_RULE)),
    "v": ("version", _pattern(r"[1-9][0-9]{0,8}", "a version is a number: 1, 2, 3 ...")),
    "kind": ("kind", _pattern(r"outputs|logs", "outputs or logs")),
    "sha": ("sha256", _pattern(r"[0-9a-f]{64}", "64 lowercase hexadecimal digits")),
    "path": ("file path", path_problem),
    "kinds": (
        "kind of record",
        _pattern(r"trainingruns|sweeps|environments", "trainingruns, sweeps or environments"),
    ),
    "name": (
        "name",
        _pattern(
            r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
            "a DNS-1123 subdomain: at most 253 of a-z, 0-9, '-' and '.', starting and ending "
            "alphanumeric",
        ),
    ),
    "uid": (
        "uid",
        _pattern(
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "a Kubernetes uid (a lowercase UUID)",
        ),
    ),
}


def shown(value: str) -> str:
    """``value`` quoted for an error message, cut at 80 characters."""
    return repr(value if len(value) <= 80 else value[:80] + "...")


@web.middleware
async def checked_variables(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """400 for a route variable outside its rule, before any handler reads it. aiohttp
    matches the encoded path and then decodes it (``..%2F`` becomes ``../``), so this
    looks at what the handlers would get."""
    for key, value in request.match_info.items():
        what, problem = VARIABLES[key]
        why = problem(value)
        if why:
            raise web.HTTPBadRequest(text=f"bad {what} {shown(value)}: {why}")
    return await handler(request)


def unruled(resources: Iterable[web.AbstractResource]) -> list[str]:
    """The variables of these routes that :data:`VARIABLES` has no rule for, sorted."""
    named = {name for resource in resources for name in re.findall(r"\{(\w+)", resource.canonical)}
    return sorted(named - VARIABLES.keys())

"""The input schemes (``spec.inputs[].uri``'s scheme): one module each, one registry.

``https`` and ``http`` (``web``), ``model`` (``models``), ``pvc`` (``pvc``), ``s3`` and
``hf`` are registered here, in that order (the CRD's pattern of a URI lists them so); a
new scheme is one module with an :class:`~torchyard.inputs.base.InputScheme` and one
:func:`register` call (docs/development/variants.md). Registration refuses a scheme
without ``check``, or without ``fetch`` when it is fetched. Called by the API (the CRD's
rules of an input and their twins), ``planning.inputs`` (the fetch Job's Pod, the node
Pods' claims), the fetcher (``inputs.fetch``), local mode and the controller; tested in
tests/unit/inputs/test_uris.py and tests/unit/variants/test_registries.py.
"""

from __future__ import annotations

from typing import Any

from torchyard.inputs.base import InputError, InputScheme, Source, key_of, scheme_of
from torchyard.inputs.hf import HubScheme
from torchyard.inputs.models import ModelScheme
from torchyard.inputs.pvc import ClaimScheme
from torchyard.inputs.s3 import S3Scheme
from torchyard.inputs.web import PlainWeb, Web
from torchyard.variants import Registry, Rule, listed


def _check(scheme: InputScheme) -> str | None:
    if not isinstance(scheme, InputScheme):
        return "is not an InputScheme"
    return None


REGISTRY: Registry[InputScheme] = Registry("input scheme", _check)
# the registry's verbs, as this package's functions
register, unregister, names = REGISTRY.register, REGISTRY.unregister, REGISTRY.names
registered, generation, summary = REGISTRY.registered, REGISTRY.generation, REGISTRY.summary


def get(name: str) -> InputScheme:
    """The scheme named ``name``; InputError naming the registered ones otherwise."""
    try:
        return REGISTRY.get(name)
    except KeyError:
        raise InputError(
            f"unknown scheme {name + '://' if name else '(none)'}; an input is {forms()}"
        ) from None


def of(source: Source | Any) -> InputScheme:
    """The scheme of a Source, an API input or a URI."""
    uri = source if isinstance(source, str) else source.uri
    return get(scheme_of(uri))


def forms() -> str:
    """How the registered schemes' URIs are written, as the messages list them."""
    written = [s.FORM for s in registered() if s.FORM]
    return ", ".join(written[:-1]) + " or " + written[-1] if len(written) > 1 else written[0]


def parse(uri: str, sha256: str = "") -> str:
    """The URI's scheme once it is one the fetcher takes; InputError otherwise."""
    if "\x00" in uri or any(c.isspace() for c in uri):
        raise InputError(f"{uri!r}: a URI may not hold a NUL byte or white space")
    scheme = scheme_of(uri)
    if scheme not in names():
        raise InputError(
            f"{uri!r}: unknown scheme {scheme + '://' if scheme else '(none)'}; an input is "
            f"{forms()}"
        )
    found = get(scheme)
    found.check(uri, sha256)
    if sha256 and not found.PINNED_BY_SHA256:
        pinned = [f"{s.TYPE}://" for s in registered() if s.PINNED_BY_SHA256 and s.FORM]
        raise InputError(f"{uri!r}: sha256 is for {' and '.join(pinned)} inputs only")
    return scheme


def pinned_by(source: Source) -> str:
    """What pins the source's content (its scheme's ``revision``)."""
    scheme = scheme_of(source.uri)
    return REGISTRY.get(scheme).revision(source) if scheme in names() else source.sha256


def cache_key(source: Source) -> str:
    """The hex sha256 that names the source's cache entry (``inputs.base``)."""
    scheme = scheme_of(source.uri)
    parts = REGISTRY.get(scheme).key_parts(source) if scheme in names() else {}
    return key_of(source, pinned_by(source), parts)


def fetched() -> tuple[str, ...]:
    """The schemes whose inputs the cache holds (all but those mounted as they are)."""
    return tuple(s.TYPE for s in registered() if s.FETCHED)


def rules() -> tuple[Rule[Any], ...]:
    """What the registered schemes bring to an input's rules: its URI is one of theirs,
    a sha256 for (and only for) those pinned by one, then each scheme's own rules."""
    pattern = "|".join(s.PATTERN for s in registered() if s.PATTERN)
    pinned = [s.TYPE for s in registered() if s.PINNED_BY_SHA256]
    return (
        Rule(
            {
                "rule": f"self.uri.matches(r'^({pattern})$')",
                "message": f"uri must be {forms()}",
                "fieldPath": ".uri",
                "reason": "FieldValueInvalid",
            },
            lambda i: scheme_of(i.uri) in names(),
        ),
        Rule(
            {
                "rule": "has(self.sha256) == ("
                + " || ".join(f"self.uri.startsWith('{s}://')" for s in pinned)
                + ")",
                "message": "sha256 is required for an "
                + " or ".join(f"{s}://" for s in pinned)
                + " uri, and only for one",
                "fieldPath": ".sha256",
            },
            lambda i: (i.sha256 is not None) == (scheme_of(i.uri) in pinned),
        ),
        *(rule for scheme in registered() for rule in scheme.RULES),
    )


def secret_rule() -> Rule[Any]:
    """An input's secretRef is for the schemes that take one."""
    taking = [s.TYPE for s in registered() if s.TAKES_SECRET]
    return Rule(
        {
            "rule": "!has(self.secretRef) || "
            + " || ".join(f"self.uri.startsWith('{s}://')" for s in taking),
            "message": f"secretRef is for {listed(f'{s}://' for s in taking)} inputs only: "
            "the Secret with the credentials they are read with",
            "fieldPath": ".secretRef",
        },
        lambda i: i.secret_ref is None or scheme_of(i.uri) in taking,
    )


for _scheme in (Web(), PlainWeb(), ModelScheme(), ClaimScheme(), S3Scheme(), HubScheme()):
    register(_scheme)
# The schemes this torchyard ships.
BUILT_IN: tuple[str, ...] = REGISTRY.seal()

__all__ = [
    "BUILT_IN",
    "REGISTRY",
    "InputScheme",
    "cache_key",
    "fetched",
    "forms",
    "generation",
    "get",
    "names",
    "of",
    "parse",
    "pinned_by",
    "register",
    "registered",
    "rules",
    "secret_rule",
    "summary",
    "unregister",
]

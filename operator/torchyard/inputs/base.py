"""What every input scheme shares: an input as the fetcher sees it (:class:`Source`), the
error every scheme raises (:class:`InputError`), and what a scheme is
(:class:`InputScheme`).

A scheme (``https``, ``model``, ``pvc``, ``s3``, ``hf``) is one module of this package
holding its URI's parser, its CEL rules and their twins, its fetcher and the parts of the
fetch Job's Pod it needs, and an :class:`InputScheme` registered by ``inputs.schemes``. The
API (the CRD's rules of an input and its twins), ``planning.inputs`` (the fetch Job, the
node Pods' volumes), the fetch Job, local mode and the controller ask the input's scheme
instead of branching on its name.

The cache key is a sha256 of what decides an entry's content: the URI, the resolved
revision (what the scheme says pins it: an https input's sha256; a model's version, which
the registry never changes; an hf input's revision as written), the scheme's own parts
(a model's reader, an s3 or hf input's Secret), the include and exclude patterns and the
layout's FORMAT. Standard library only; tested in tests/unit/inputs/test_uris.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torchyard.launch.contract import INPUT_VARIABLE_PREFIX
from torchyard.variants import Rule

# Bump when an entry's layout changes: every key changes with it.
FORMAT = "1"
# An input's name: what TORCHYARD_INPUT_<NAME> is made of (upper-cased).
NAME = r"^[a-z][a-z0-9_]{0,31}$"
SHA256 = r"^[a-f0-9]{64}$"
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# A path segment that is '.' or '..', written plainly or %-encoded, after either slash.
DOT_SEGMENT = re.compile(r"(^|[/\\])(\.|%2[eE]){1,2}([/\\]|$)")


class InputError(ValueError):
    """An input the fetcher cannot take; the message says which and what to do."""


@dataclass(frozen=True)
class Source:
    """One input, as the fetcher sees it."""

    uri: str
    sha256: str = ""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    # Who reads a model:// input (its ServiceAccount): part of its key, so that a run
    # sees only what its own ServiceAccount may read.
    reader: str = ""
    # The Secret an s3:// input reads the store with: part of its key, as the reader is.
    secret: str = ""

    @property
    def scheme(self) -> str:
        return scheme_of(self.uri)

    @property
    def revision(self) -> str:
        """What pins the content, as its scheme says (the sha256, the model's version, the
        Hub revision as written); the sha256 for a scheme that is not registered."""
        from torchyard.inputs import schemes  # the registry imports the scheme modules

        return schemes.pinned_by(self)

    @property
    def key(self) -> str:
        from torchyard.inputs import schemes

        return schemes.cache_key(self)


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""


def env_name(name: str) -> str:
    """The variable that holds an input's folder: TORCHYARD_INPUT_<NAME>."""
    return INPUT_VARIABLE_PREFIX + name.upper()


def key_of(source: Source, revision: str, parts: Mapping[str, str]) -> str:
    """The hex sha256 that names the source's cache entry (see the module docstring)."""
    blob = {
        "format": FORMAT,
        "uri": source.uri,
        "revision": revision,
        "include": sorted(source.include),
        "exclude": sorted(source.exclude),
        **parts,
    }
    return hashlib.sha256(
        json.dumps(blob, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def patterns_valid(patterns: Sequence[str]) -> None:
    """InputError for a pattern that could never name a file inside the input."""
    for pattern in patterns:
        if not pattern or pattern.startswith("/") or "\x00" in pattern:
            raise InputError(
                f"pattern {pattern!r}: a pattern is relative to the input's folder "
                "(e.g. 'images/*.jpg'), not empty nor absolute"
            )


@dataclass(frozen=True)
class FetchPod:
    """What a scheme adds to its fetch Job's Pod: variables (``env``, as Pod env entries),
    ``env_from`` sources, mounts and volumes, and the ServiceAccount it runs as (None: the
    namespace's default)."""

    env: tuple[dict[str, Any], ...] = ()
    env_from: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    service_account: str | None = None


@dataclass(frozen=True)
class RegistryService:
    """Where a fetch Job finds the model registry service (the operator's settings), and
    the audience of the tokens it takes (``api.wire``'s)."""

    url: str = ""
    ca: str = ""
    audience: str = ""


class InputScheme:
    """The descriptor of an input scheme (see the module docstring): what it is, and the
    defaults of a scheme without special needs (fetched into the cache, pinned by
    nothing but its URI, read without credentials)."""

    TYPE: ClassVar[str] = ""  # the URI's scheme
    SUMMARY: ClassVar[str] = ""  # what its URIs name: the uri field's description says it
    FORM: ClassVar[str] = ""  # how a URI of it is written, for the messages
    # the CEL (RE2) pattern its URIs match, one alternative of the uri field's rule
    # ("": another scheme's pattern covers it, as https's covers http)
    PATTERN: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[Any, ...]] = ()  # an input's fields are every scheme's
    RULES: ClassVar[tuple[Rule[Any], ...]] = ()  # CEL of an input, with twins on the API's
    PINNED_BY_SHA256: ClassVar[bool] = False  # its inputs name a sha256 (and only its)
    TAKES_SECRET: ClassVar[bool] = False  # its inputs may name a secretRef
    FETCHED: ClassVar[bool] = True  # False: mounted as it is (pvc), nothing in the cache
    # what local mode says of an input it cannot have ("": it can)
    NOT_LOCAL: ClassVar[str] = ""
    READS_REGISTRY: ClassVar[bool] = False  # local mode reads it from its own store

    def check(self, uri: str, sha256: str) -> None:
        """InputError when ``uri`` is not one of this scheme's (the callback every
        scheme has; the generic checks, white space and sha256, are done already)."""
        raise NotImplementedError

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        """Fill ``staging/data`` (and ``staging/revision`` where it resolves one); the
        bytes received (a fetched scheme's callback)."""
        raise NotImplementedError

    def revision(self, source: Source) -> str:
        """What pins the content as written."""
        return source.sha256

    def current(self, source: Source, env: Mapping[str, str]) -> str | None:
        """The revision the store has now, for a scheme whose content may change under one
        URI (s3, hf: a cached entry of another revision is fetched again); None: the URI
        pins it."""
        return None

    def key_parts(self, source: Source) -> dict[str, str]:
        """What else decides the cache entry (a model's reader, a Secret)."""
        return {}

    def fetch_pod(self, source: Source, namespace: str, registry: RegistryService) -> FetchPod:
        return FetchPod()

    def claim(self, uri: str) -> tuple[str, str] | None:
        """(claim, subpath) of an input mounted from a claim; None: fetched."""
        return None

    def unversioned(self, uri: str) -> bool:
        """Whether the input names no version yet (a model's latest, pinned before the
        fetch)."""
        return False

    @classmethod
    def missing_callbacks(cls) -> list[str]:
        """The callbacks this scheme leaves out: ``check``, and ``fetch`` when fetched."""
        wanted = ["check", *(["fetch"] if cls.FETCHED else [])]
        return [name for name in wanted if getattr(cls, name) is getattr(InputScheme, name)]

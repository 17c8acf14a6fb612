"""The ``pvc://<claim>[/subpath]`` scheme: a PersistentVolumeClaim of the run's namespace,
mounted read-only into the node Pods as it is (nothing fetched, nothing cached; local
mode, which has no claims, refuses it). Registered by ``inputs.schemes``; tested in
tests/unit/inputs/test_uris.py and tests/unit/planning/test_inputs.py.
"""

from __future__ import annotations

import re

from torchyard.inputs.base import DNS1123_LABEL, DOT_SEGMENT, InputError, InputScheme

_CLAIM = re.compile(r"^pvc://(" + DNS1123_LABEL + r")(/(.*))?$")


def claim_of(uri: str) -> tuple[str, str]:
    """(claim, subpath) of a pvc:// URI; InputError when it is not one or the subpath
    leaves the claim."""
    match = _CLAIM.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not a claim input: write pvc://<claim>[/subpath], the claim's "
            "name a DNS-1123 label"
        )
    sub = (match.group(4) or "").strip("/")
    if DOT_SEGMENT.search(sub) or "\\" in sub or "//" in sub or "\x00" in sub:
        raise InputError(
            f"{uri!r}: the subpath must stay inside the claim (no '.', '..', "
            "backslash or empty segment, plain or %-encoded)"
        )
    return match.group(1), sub


class ClaimScheme(InputScheme):
    """``pvc://``: mounted from its claim, read-only."""

    TYPE = "pvc"
    SUMMARY = (
        "pvc://<claim>[/subpath] (a PersistentVolumeClaim of the namespace, mounted "
        "read-only; nothing is fetched)"
    )
    FORM = "pvc://<claim>[/subpath]"
    PATTERN = "pvc://" + DNS1123_LABEL + r"(/\S*)?"
    FETCHED = False
    NOT_LOCAL = "a pvc:// input names a claim of the cluster, which local mode cannot mount"

    def check(self, uri: str, sha256: str) -> None:
        claim_of(uri)

    def claim(self, uri: str) -> tuple[str, str]:
        return claim_of(uri)

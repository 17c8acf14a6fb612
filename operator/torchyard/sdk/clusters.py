"""Reaching the cluster from a laptop: the kubeconfig, the namespace kubectl would use, and
the two ways a call fails, in words a user can act on (both ``torchyard.k8s``'s, raised by
every call of the SDK that talks to the API, so no caller needs the client library's):

- :class:`ApiError`: the apiserver answered no; ``status`` is its HTTP code, ``message``
  its reason.
- :class:`Unreachable`: no answer at all: no kubeconfig (or no such context), a server
  that does not answer, a connection that breaks. Its message ends with what to check.

Called by the CLI (``torchyard.cli.app`` turns both into one line, so no command shows a
traceback for a missing kubeconfig or a cluster that is down) and by scripts. Tested in
tests/unit/cli/test_errors.py and tests/unit/k8s/test_unreachable.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchyard import k8s
from torchyard.k8s import ApiError, Unreachable


def connect(kubeconfig: str | None = None, context: str | None = None) -> None:
    """Use this kubeconfig and/or context from now on (:class:`Unreachable` when it is
    not there or has no such context). Without them, the first call loads the one in use:
    ``$KUBECONFIG``, in a Pod its own ServiceAccount."""
    if kubeconfig or context:
        k8s.load(kubeconfig, context)


def configured(kubeconfig: str | None = None, context: str | None = None) -> bool:
    """Whether there is any way to a cluster at all: a kubeconfig or context given,
    ``$KUBECONFIG`` set, ``~/.kube/config`` there, or a Pod's own ServiceAccount. (Whether
    it works is another matter: a call then raises :class:`Unreachable` saying why.)"""
    if kubeconfig or context or os.environ.get("KUBECONFIG"):
        return True
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    return Path("~/.kube/config").expanduser().is_file()


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, in a Pod its own, else default."""
    return k8s.default_namespace(kubeconfig, context)


__all__ = ["ApiError", "Unreachable", "configured", "connect", "default_namespace"]

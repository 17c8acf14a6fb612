"""The torchyard operator: Kopf handlers over the pure layers.

- ``handlers``: the Kopf handlers (the only module that imports kopf, with ``operators``).
- ``reconcile``: parse -> plan -> apply -> status, as plain functions.
- ``operators``: :func:`run` (tests run it in a thread) and :func:`main`
  (``torchyard operator``, ``python -m torchyard.controller``).
- ``options``: the command-line options, importable without Kopf.
"""

from __future__ import annotations

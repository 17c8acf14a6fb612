"""The torchyard operator: Kopf handlers over the pure layers.

- ``handlers``: the Kopf handlers (the only module that imports kopf, with ``operators``);
  they put keys on the ``workqueue``, whose workers call the reconcilers.
- ``trainingruns``: the TrainingRun reconcile as one story (observe -> decide -> apply ->
  write status once), over the policies beside it: ``admission`` (gangs),
  ``failure_policy`` (deadline, restarts), ``finalize`` (model registration),
  ``ttl_after_finished``; ``environments``: the Environment reconcile (image builds);
  ``context``: what they share (Context, Result, the one status write).
- ``cache``: the watch-fed view of Nodes and Pods that gang admission decides over; the
  admission pass over every pool's queue is ``admission.run_pass``, run by ``handlers``.
- ``operators``: :func:`run` (tests run it in a thread) and :func:`main`
  (``torchyard operator``, ``python -m torchyard.controller``).
- ``options``: the command-line options, importable without Kopf.
"""

from __future__ import annotations

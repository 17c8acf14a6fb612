"""The scoring script and the threads that call it: the guide's ``init()`` once, then
``run(raw_data)`` per request, each within its time.

:func:`load` imports the entry script from its file (its folder first on ``sys.path``, so
that it imports its neighbours, e.g. the training script's model classes).
:class:`Scorer` calls ``init()`` once, then ``run()`` on a pool of ``concurrency`` threads:
a call that takes longer than the request's time is answered with :class:`RunTimeout`
while its thread goes on; such a thread counts as *stuck* until ``run()`` returns, and
once every thread is stuck the Pod says it is not alive (the kubelet restarts it), so a
``run()`` that hangs never leaves a Pod that takes requests and answers none.
:func:`encode` is the JSON of what ``run()`` returned (Azure's rule: always JSON).

Standard library only (the runtime ships it into user images); called by
``serving.app`` and ``serving.server``; tested in tests/unit/serving/test_scoring.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any


class ScriptError(Exception):
    """The entry script cannot be used: missing, no init()/run(), or it raised."""


class RunTimeout(Exception):
    """``run()`` took longer than the request's time."""


def load(path: str) -> ModuleType:
    """The entry script ``path`` as a module (its folder first on ``sys.path``)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ScriptError(f"the entry script {path} does not exist: check entryScript and source")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ScriptError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    for function in ("init", "run"):
        if not callable(getattr(module, function, None)):
            raise ScriptError(
                f"the entry script {path} defines no {function}(): a scoring script defines "
                "init() (load the model from AZUREML_MODEL_DIR) and run(raw_data)"
            )
    return module


def _plain(value: Any) -> Any:
    """What ``json`` cannot write but a scoring script often returns: numpy's and torch's
    arrays and scalars (``tolist()``, ``item()``)."""
    for method in ("tolist", "item"):
        if callable(getattr(value, method, None)):
            return getattr(value, method)()
    raise TypeError(f"run() returned a {type(value).__name__}, which JSON cannot hold")


def encode(result: Any) -> bytes:
    """The response body of ``run()``'s result: bytes as they are, anything else as JSON."""
    if isinstance(result, bytes | bytearray):
        return bytes(result)
    return json.dumps(result, default=_plain).encode()


_OWN = os.path.dirname(os.path.abspath(__file__))
# Frames of the runtime and of the machinery that calls run() on a thread: not the script's.
_MACHINERY = (_OWN + os.sep, os.sep + "asyncio" + os.sep, os.sep + "concurrent" + os.sep)


def script_traceback(err: BaseException) -> str:
    """``err``'s traceback without the runtime's frames: what the scoring script did."""
    found = traceback.TracebackException.from_exception(err)
    kept = [f for f in found.stack if not any(m in f.filename for m in _MACHINERY)]
    found.stack = traceback.StackSummary.from_list(kept)
    return "".join(found.format()).rstrip()


class Scorer:
    """The script's ``init()`` and ``run()`` on ``concurrency`` threads."""

    def __init__(self, module: ModuleType, concurrency: int) -> None:
        self.module = module
        self.concurrency = concurrency
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="run")
        self._lock = threading.Lock()
        self._stuck = 0
        self.init_seconds: float | None = None

    def init(self) -> None:
        """``init()``, timed; whatever it raises goes to the caller."""
        started = time.monotonic()
        self.module.init()
        self.init_seconds = time.monotonic() - started

    @property
    def stuck(self) -> int:
        """Threads still in a ``run()`` whose request timed out."""
        return self._stuck

    @property
    def alive(self) -> bool:
        """Some thread can still take a request."""
        return self._stuck < self.concurrency

    def _call(self, raw: Any, state: dict[str, bool]) -> Any:
        try:
            return self.module.run(raw)
        finally:
            with self._lock:
                state["done"] = True
                if state.get("late"):
                    self._stuck -= 1

    async def run(self, raw: Any, timeout: float) -> Any:
        """``run(raw)`` on a thread; :class:`RunTimeout` after ``timeout`` seconds (a call
        still waiting for a thread then is dropped, one in ``run()`` counts as stuck)."""
        state: dict[str, bool] = {}
        call = self.pool.submit(self._call, raw, state)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(call)), timeout)
        except asyncio.TimeoutError:
            if not call.cancel():
                with self._lock:
                    if not state.get("done"):
                        state["late"] = True
                        self._stuck += 1
            raise RunTimeout(f"run() took longer than {timeout:g} s") from None

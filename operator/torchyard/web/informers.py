"""A namespace's TrainingRuns kept in memory by one list and then a watch, so that the
runs list pages and refreshes from memory: with 10,000 runs, listing them all from the
apiserver takes seconds; a watch keeps the copy current within a moment of each change.

:class:`Informers` holds at most :data:`MOST` namespaces (the least recently asked one's
watch stops); a namespace whose list the apiserver refuses (403: the caller may not list
it) is not kept: the refusal is raised to the page, and the next request asks again. Used
by ``torchyard.web.source.LiveSource``; tested on the real control plane through the
pages in tests/integration/web/.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from torchyard import k8s

Obj = dict[str, Any]
MOST = 32  # namespaces watched at once
FIRST_LIST_SECONDS = 120.0  # how long a page waits for a namespace's first list
RETRY_SECONDS = 2.0  # after a broken watch, before listing again


class Informer:
    """One namespace's TrainingRuns: a thread lists them, then follows a watch from the
    list's version (again from a fresh list when the version is gone or the stream
    broke), until :meth:`stop`."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.items: dict[str, Obj] = {}
        self.error: Exception | None = None
        self.listed = threading.Event()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._stream: k8s.WatchStream | None = None
        threading.Thread(target=self._run, name=f"web-informer-{namespace}", daemon=True).start()

    def snapshot(self) -> list[Obj]:
        with self._lock:
            return list(self.items.values())

    def stop(self) -> None:
        self._stopped.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                items, version = k8s.list_versioned(k8s.TRAININGRUNS, self.namespace)
            except (k8s.ApiError, k8s.Unreachable) as err:
                self.error = err  # (the page says it; the informer is dropped)
                self.listed.set()
                return
            with self._lock:
                self.items = {o["metadata"]["name"]: o for o in items}
            self.listed.set()
            try:
                self._follow(version)
            except (k8s.ApiError, k8s.Unreachable):
                self._stopped.wait(RETRY_SECONDS)  # then list again

    def _follow(self, version: str) -> None:
        while not self._stopped.is_set():
            self._stream = k8s.WatchStream(k8s.TRAININGRUNS, self.namespace, version)
            for batch in self._stream:
                with self._lock:
                    for kind, obj in batch:
                        name = obj.get("metadata", {}).get("name")
                        if kind == "DELETED":
                            self.items.pop(name, None)
                        elif name:
                            self.items[name] = obj
            version = self._stream.version


class Informers:
    """An :class:`Informer` per namespace asked for, at most :data:`MOST`."""

    def __init__(self) -> None:
        self._by_namespace: OrderedDict[str, Informer] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, namespace: str) -> Informer:
        """The namespace's informer, started when it is not yet (``torchyard ui`` starts
        its namespace's at once, so that the first page finds it listed)."""
        with self._lock:
            informer = self._by_namespace.get(namespace)
            if informer is None:
                informer = self._by_namespace[namespace] = Informer(namespace)
                while len(self._by_namespace) > MOST:
                    self._by_namespace.popitem(last=False)[1].stop()
            self._by_namespace.move_to_end(namespace)
            return informer

    def runs(self, namespace: str, wait: float = FIRST_LIST_SECONDS) -> list[Obj]:
        """The namespace's runs (the first call waits for its first list); the list's
        error, if the apiserver refused it."""
        informer = self.start(namespace)
        started = time.monotonic()
        if not informer.listed.wait(wait):
            raise k8s.Unreachable(
                f"no list of {namespace}'s TrainingRuns within {time.monotonic() - started:.0f}s"
            )
        if informer.error is not None:
            with self._lock:
                if self._by_namespace.get(namespace) is informer:
                    del self._by_namespace[namespace]
            raise informer.error
        return informer.snapshot()

    def stop(self) -> None:
        with self._lock:
            for informer in self._by_namespace.values():
                informer.stop()
            self._by_namespace.clear()

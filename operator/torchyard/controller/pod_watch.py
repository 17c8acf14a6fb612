"""The operator's own Pod watch, outside Kopf: Pod events reach the admission cache and
their run's status without Kopf's per-object workers.

Kopf handles each watch event through a worker task per object (a batching window, its
handler machinery, a log line): with thousands of Pods that delays a Pod's phase change
by seconds before its run's status can say it. :class:`PodWatch` instead reads one watch
stream per watched namespace (or one for the cluster) on a thread of its own
(``k8s.WatchStream``), keeps only the Pods admission or a run's status cares about
(torchyard's, labelled with their run or endpoint, and others' that ask for GPUs), and
hands each
chunk of events to the event loop at once (one ``call_soon_threadsafe`` per chunk):
there :func:`deliver` feeds the cache (``cache.Cache.feed``), wakes the admission pass,
and queues the owning run on the work queue's status lane (``workqueue.STATUS``), unless
the event only brings back this operator's own write (``cache.Cache.echo``). A run's
reconcile reads every Pod it has, so a big gang's run is queued a little later
(:func:`batch_delay`: its Pods' events in that window make one reconcile): the status work
of a fan-out of hundreds of Pods stays a small part of a core, which the scheduler and
the kubelets need then, and a run of a few Pods is queued at once.

It lists first and watches from the list's ``resourceVersion``; when the watch ends it
watches on from the last version it read, and when that version is too old (410) it
lists again and delivers the difference from what it had seen: the Pods that changed
meanwhile, and those gone as ``DELETED``. Started and stopped by ``handlers`` (Kopf's
start-up and cleanup); tested against a real apiserver in
tests/integration/test_pod_watch.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchyard import k8s
from torchyard.controller import cache, context, workqueue
from torchyard.planning import names

# The server ends a watch after this long (then it is opened again from its version).
SERVER_TIMEOUT_SECONDS = 300
# After a failed list or watch (apiserver away), wait this long before the next try.
RETRY_SECONDS = 1.0

# Pods of one run up to which its Pods' events queue it at once; above, each Pod adds
# this much to the delay (a reconcile costs about 0.1 ms of CPU per Pod of its run,
# measured by benchmarks/peers.py --profile), up to BATCH_MAX_SECONDS.
BATCH_FROM_PODS = 16
BATCH_SECONDS_PER_POD = 0.002
BATCH_MAX_SECONDS = 1.0

Event = tuple[str, dict[str, Any]]
logger = logging.getLogger("torchyard.controller")


def relevant(pod: Mapping[str, Any]) -> bool:
    """A Pod torchyard made (labelled with its run or its endpoint), or another that asks
    for GPUs."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return names.LABEL_RUN in labels or names.LABEL_ENDPOINT in labels or cache.holds_gpus(pod)


def batch_delay(pods: int) -> float:
    """How long a run of ``pods`` Pods waits on the status lane after its Pod changed:
    none up to :data:`BATCH_FROM_PODS`, then :data:`BATCH_SECONDS_PER_POD` per Pod, at
    most :data:`BATCH_MAX_SECONDS` (a gang of 256: 0.5 s; of 1024 or more: 1 s)."""
    if pods <= BATCH_FROM_PODS:
        return 0.0
    return min(BATCH_MAX_SECONDS, BATCH_SECONDS_PER_POD * pods)


def deliver(
    ctx: context.Context, queue: workqueue.WorkQueue, wake: asyncio.Event, events: list[Event]
) -> None:
    """In the event loop: feed the cache, wake the admission pass, and queue each run
    whose Pod changed on the status lane (not for an echo of this operator's write),
    after :func:`batch_delay` for its number of Pods."""
    for type_, pod in events:
        ctx.cache.feed("Pod", type_, pod)
        meta = pod.get("metadata") or {}
        endpoint = (meta.get("labels") or {}).get(names.LABEL_ENDPOINT)
        if endpoint is not None:  # a serving Pod: its endpoint's status says how it is
            queue.add(("OnlineEndpoint", str(meta.get("namespace") or ""), endpoint))
            continue
        run = (meta.get("labels") or {}).get(names.LABEL_RUN)
        if run is None or (type_ != "DELETED" and ctx.cache.echo(pod)):
            continue
        ns = str(meta.get("namespace") or "")
        delay = batch_delay(ctx.cache.run_size((ns, run)))
        queue.add(("TrainingRun", ns, run), delay, lane=workqueue.STATUS)
    if events:
        wake.set()


class PodWatch:
    """One thread per watched namespace (or the cluster), each listing then watching."""

    def __init__(
        self,
        client: k8s.Client,
        namespaces: Sequence[str],
        hand_over: Callable[[list[Event]], None],
        *,
        server_timeout: int = SERVER_TIMEOUT_SECONDS,
    ) -> None:
        self.client = client  # the operator's own credentials
        self.namespaces = list(workqueue.watched(namespaces))
        self.hand_over = hand_over  # called on the watch's thread with each chunk
        self.server_timeout = server_timeout
        self.stopping = threading.Event()
        self.listed = threading.Event()  # every namespace's first list was handed over
        self._listed: set[str | None] = set()
        self._streams: dict[str | None, k8s.WatchStream] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for namespace in self.namespaces:
            thread = threading.Thread(
                target=self._run, args=(namespace,), name=f"pod-watch-{namespace}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.close()
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, namespace: str | None) -> None:
        seen: dict[tuple[str, str], str] = {}  # relevant Pods: (namespace, name) -> version
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._relist(namespace, seen)
                version = self._watch(namespace, version, seen)
            except k8s.ApiError as err:
                if err.status == 410:  # too old: list again, deliver the difference
                    version = ""
                    continue
                logger.warning("the Pod watch of %s failed: %s", namespace or "the cluster", err)
                self.stopping.wait(RETRY_SECONDS)
            except k8s.Unreachable as err:
                if self.stopping.is_set():
                    return
                logger.warning("the Pod watch of %s broke: %s", namespace or "the cluster", err)
                self.stopping.wait(RETRY_SECONDS)
            except Exception:  # a bug: say it loudly, and list again
                logger.exception("the Pod watch of %s failed", namespace or "the cluster")
                version = ""
                self.stopping.wait(RETRY_SECONDS)

    def _relist(self, namespace: str | None, seen: dict[tuple[str, str], str]) -> str:
        items, version = self.client.list_versioned(k8s.PODS, namespace)
        events: list[Event] = []
        listed: set[tuple[str, str]] = set()
        for pod in items:
            if not relevant(pod):
                continue
            key = _key(pod)
            listed.add(key)
            now = str(pod["metadata"].get("resourceVersion") or "")
            if seen.get(key) != now:
                events.append(("MODIFIED" if key in seen else "ADDED", pod))
                seen[key] = now
        for key in [k for k in seen if k not in listed]:
            del seen[key]
            gone = {"metadata": {"namespace": key[0], "name": key[1]}}
            events.append(("DELETED", gone))
        self._hand(events)
        with self._lock:
            self._listed.add(namespace)
            if self._listed >= set(self.namespaces):
                self.listed.set()
        return version

    def _watch(self, namespace: str | None, version: str, seen: dict[tuple[str, str], str]) -> str:
        stream = self.client.watch(
            k8s.PODS, namespace, version, timeout_seconds=self.server_timeout
        )
        with self._lock:
            if self.stopping.is_set():
                return version
            self._streams[namespace] = stream
        try:
            for batch in stream:  # what one read off the socket held: handed on at once
                chunk: list[Event] = []
                for type_, pod in batch:
                    if not relevant(pod):
                        continue
                    key = _key(pod)
                    if type_ == "DELETED":
                        seen.pop(key, None)
                    else:
                        seen[key] = str(pod["metadata"].get("resourceVersion") or "")
                    chunk.append((type_, pod))
                self._hand(chunk)
        finally:
            with self._lock:
                self._streams.pop(namespace, None)
        return stream.version

    def _hand(self, events: list[Event]) -> None:
        if events and not self.stopping.is_set():
            self.hand_over(events)


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")

"""Run records: when a TrainingRun or a Sweep has ended, an Environment build has ended, or
a TrainingRun or Sweep is deleted before it ended, its record (``torchyard.records``) goes
to the registry service beside the run's archive, where it outlives the object.

A TrainingRun's record is written by the first reconcile after its terminal status, before
its TTL deletes its Pods (so the record holds their timings and log tails), and the run's
status then says so once (condition ``Recorded`` True): an operator restart neither writes
it again nor loses it. While the registry cannot be reached the TTL waits and the write is
tried again every :data:`RETRY_SECONDS`; a registry that refuses (the operator lacks
``create`` on ``runrecords``) gets ``Recorded`` False with its answer, a Warning, and a try
every :data:`REFUSED_RETRY_SECONDS`, and the TTL goes on. A Sweep's is written the same
way. An Environment keeps no condition of it (its status is recomputed each time): its
record is written when a build ends, remembered in memory by uid and generation, and
written again (the same record, in the same place) after a restart. A deletion is seen on
the watch's last event: what it held is recorded at once, best effort (the operator keeps
no finalizer on user objects).

Without a registry service (no ``TORCHYARD_REGISTRY_URL``) nothing is recorded. Called by
``trainingruns``, ``sweeps``, ``environments`` and ``handlers``; tested in
tests/unit/controller/test_recording.py and tests/integration/test_run_records.py.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchyard import k8s, records, status
from torchyard.controller.context import Context, Event, Log
from torchyard.planning import names
from torchyard.records import build
from torchyard.registry.client import RegistryClient, RegistryError

CONDITION = "Recorded"
RETRY_SECONDS = 5.0
REFUSED_RETRY_SECONDS = 60.0
LOG_BYTES = 256 << 10  # of each node Pod's log tail read
LOG_TIMEOUT_SECONDS = 5.0
logger = logging.getLogger("torchyard.controller")


def client(ctx: Context, timeout: float = 60) -> RegistryClient:
    """The registry service's client with the operator's token and CA (OSError or
    ValueError when the token file or the CA cannot be read)."""
    with open(ctx.settings.registry_token_file) as f:
        token = f.read().strip()
    # An https registry is verified with the CA the chart mounts (or the system's).
    ca = ctx.settings.registry_ca
    tls = ssl.create_default_context(cadata=ca) if ca else None
    return RegistryClient(ctx.settings.registry_url, token, ssl_context=tls, timeout=timeout)


@dataclass(frozen=True)
class Recorded:
    """What recording did: the status to write (None: none), its Events, when to try
    again (None: done) and whether the TTL must wait for it (the registry was not reached)."""

    status: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    retry: float | None = None
    hold: bool = False


def needs_recording(ctx: Context, body: Mapping[str, Any]) -> bool:
    """A registry is there and the object's status does not say it was recorded."""
    cond = status.find((body.get("status") or {}).get("conditions"), CONDITION)
    return bool(ctx.settings.registry_url) and (cond or {}).get("status") != "True"


def send(ctx: Context, record: records.Record) -> tuple[str, str]:
    """("written" | "refused" | "unreachable", what the registry said)."""
    try:
        client(ctx).put_record(record)
    except RegistryError as err:
        return ("refused" if err.status is not None else "unreachable"), str(err)
    except (OSError, ValueError) as err:  # the token file, the CA
        return "unreachable", f"the registry service is not reachable: {err}"
    return "written", ""


def events_of(ctx: Context, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Events about ``obj``, oldest first (none when they cannot be listed)."""
    meta = obj["metadata"]
    selector = f"involvedObject.name={meta['name']},involvedObject.uid={meta.get('uid', '')}"
    try:
        items = ctx.k8s.list_(k8s.EVENTS, meta["namespace"], field_selector=selector)
    except (k8s.ApiError, k8s.Unreachable):
        return []
    return sorted(
        items,
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "",
    )


def _rank(pod: Mapping[str, Any], default: int) -> int:
    rank = str((pod["metadata"].get("labels") or {}).get(names.LABEL_NODE_RANK, default))
    return int(rank) if rank.isdigit() else default


def tails(
    ctx: Context,
    namespace: str,
    pods: Sequence[Mapping[str, Any]],
    container: str = "trainer",
    failing: int | None = None,
) -> dict[int, list[str]]:
    """node rank -> the last lines of its Pod's ``container`` log (those that answer): the
    ``failing`` node's and the first others', at most ``build.MAX_TAIL_NODES`` read."""
    ranked = sorted(((_rank(p, i), p) for i, p in enumerate(pods)), key=lambda rp: rp[0])
    ranked.sort(key=lambda rp: rp[0] != failing)  # (stable: the failing node first)
    out: dict[int, list[str]] = {}
    for rank, pod in ranked[: build.MAX_TAIL_NODES]:
        try:
            out[rank] = list(
                ctx.k8s.pod_log_lines(
                    namespace,
                    pod["metadata"]["name"],
                    container=container,
                    tail_lines=build.TAIL_LINES,
                    limit_bytes=LOG_BYTES,
                    timeout=LOG_TIMEOUT_SECONDS,
                )
            )
        except (k8s.ApiError, k8s.Unreachable):
            continue
    return out


def _recorded_status(
    body: Mapping[str, Any], outcome: str, message: str, now: datetime, log: Log
) -> Recorded:
    """The status and Events that say how the write went."""
    previous = dict(body.get("status") or {})
    meta = body["metadata"]
    where = f"{body['kind']} {meta['namespace']}/{meta['name']}"
    if outcome == "unreachable":
        log.warning("%s: its record is not written yet: %s", where, message)
        return Recorded(retry=RETRY_SECONDS, hold=True)
    written = outcome == "written"
    cond = status.condition(
        CONDITION,
        written,
        "Written" if written else "RegistryRefused",
        "the run's record is in the registry"
        if written
        else f"the registry refused the record: {message}",
        observed_generation=meta.get("generation"),
    )
    others = [c for c in previous.get("conditions") or [] if c.get("type") != CONDITION]
    merged = status.merge(previous.get("conditions"), [cond], now)
    new = {**previous, "conditions": [*others, *merged]}
    if written:
        log.info("%s: its record is in the registry", where)
        return Recorded(new)
    if new == previous:
        return Recorded(retry=REFUSED_RETRY_SECONDS)
    event = Event("Warning", "RecordRefused", str(cond["message"]))
    return Recorded(new, [event], retry=REFUSED_RETRY_SECONDS)


def finished_run(
    ctx: Context, body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], log: Log
) -> Recorded:
    """A finished TrainingRun's record, unless written already."""
    if not needs_recording(ctx, body):
        return Recorded()
    now = ctx.clock()
    ns = body["metadata"]["namespace"]
    failing = ((body.get("status") or {}).get("failure") or {}).get("node")
    read = tails(ctx, ns, pods, failing=failing if isinstance(failing, int) else None)
    record = records.trainingrun_record(body, pods, events_of(ctx, body), read, now)
    return _recorded_status(body, *send(ctx, record), now, log)


def finished_sweep(ctx: Context, body: Mapping[str, Any], log: Log) -> Recorded:
    """A finished Sweep's record, unless written already."""
    if not needs_recording(ctx, body):
        return Recorded()
    now = ctx.clock()
    record = records.sweep_record(body, events_of(ctx, body), now)
    return _recorded_status(body, *send(ctx, record), now, log)


def built_environment(ctx: Context, body: Mapping[str, Any], build_pods: Sequence[Any]) -> bool:
    """An Environment whose build ended: its record, once per uid and generation in this
    process. False when the registry was not reached (try again)."""
    if not environment_wanted(ctx, body):
        return True
    meta = body["metadata"]
    key = ("Environment", str(meta["namespace"]), str(meta["name"]))
    now = ctx.clock()
    log_tail = next(iter(tails(ctx, key[1], build_pods[-1:], container="build").values()), [])
    record = records.environment_record(body, events_of(ctx, body), log_tail, now)
    outcome, message = send(ctx, record)
    if outcome == "unreachable":
        logger.warning("Environment %s/%s: its record is not written yet: %s", *key[1:], message)
        return False
    if outcome == "refused":
        logger.warning("Environment %s/%s: the registry refused its record: %s", *key[1:], message)
    ctx.recorded[key] = _marker(body)
    return True


def _marker(body: Mapping[str, Any]) -> str:
    return f"{body['metadata'].get('uid')}/{body['metadata'].get('generation')}"


def environment_wanted(ctx: Context, body: Mapping[str, Any]) -> bool:
    """A registry is there and this process has not recorded this build (uid, generation)."""
    meta = body["metadata"]
    key = ("Environment", str(meta["namespace"]), str(meta["name"]))
    return bool(ctx.settings.registry_url) and ctx.recorded.get(key) != _marker(body)


def deleted(ctx: Context, body: Mapping[str, Any]) -> None:
    """A TrainingRun or Sweep deleted: what it held, recorded unless it was already (best
    effort: run in a thread by ``handlers``, never raises)."""
    if not needs_recording(ctx, body) or not (body.get("metadata") or {}).get("uid"):
        return
    meta = body["metadata"]
    now = ctx.clock()
    try:
        if body.get("kind") == "Sweep":
            record = records.sweep_record(body, events_of(ctx, body), now, deleted=True)
        else:
            selector = f"{names.LABEL_RUN}={meta['name']}"
            pods = [
                p
                for p in ctx.k8s.list_(k8s.PODS, meta["namespace"], label_selector=selector)
                if any(
                    o.get("uid") == meta["uid"] for o in p["metadata"].get("ownerReferences", [])
                )
            ]
            record = records.trainingrun_record(
                body,
                pods,
                events_of(ctx, body),
                tails(ctx, meta["namespace"], pods),
                now,
                deleted=True,
            )
        outcome, message = send(ctx, record)
    except Exception:  # a bug: said loudly, never raised into the watch
        logger.exception("the record of deleted %s %s could not be made", body.get("kind"), meta)
        return
    if outcome != "written":
        logger.warning(
            "%s %s/%s was deleted and its record could not be written: %s",
            body.get("kind"),
            meta["namespace"],
            meta["name"],
            message,
        )

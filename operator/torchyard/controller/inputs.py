"""A run's fetched inputs before admission: the cache's index, the fetch Jobs, evictions.

The namespace's cache is a claim (``planning.inputs.cache_claim``) whose entries the
fetch Jobs write; the operator cannot read the claim, so it keeps an index: one
ConfigMap per committed entry (key, URI, revision, digest, bytes, when last used), made
from what the Job that committed it reported in its termination message.
:func:`prepare` looks each of a run's fetched inputs up there: an entry is ready and
fetches nothing; else the key's one fetch Job (shared by every run that asks for the key
meanwhile) is started, after taking the least recently used entries that no unfinished
run uses out of the index (the Job deletes their folders) until the cache is under its
limit. A Job that failed fails the runs that waited for it; a run that comes later starts
a new one. A fetch Pod the kubelet holds back (an s3:// input's Secret, or a key of it,
missing: CreateContainerConfigError) keeps the runs waiting with the Secret and the fix
in their condition; the operator does not read Secrets itself (least privilege: the
chart grants no ``get`` on them cluster-wide). Called by ``trainingruns`` before
admission; tested against a real control plane in tests/integration/test_inputs.py and
on the real node in tests/node/test_s3_inputs_on_node.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from torchyard import api, k8s
from torchyard.api.times import parse_time
from torchyard.controller import environments as environment_builds
from torchyard.controller.context import Context, Log
from torchyard.inputs import cache, schemes, uris
from torchyard.planning import endpoints as endpoint_plans
from torchyard.planning import inputs as planned
from torchyard.planning import names
from torchyard.status import inputs as input_status
from torchyard.status import timestamp
from torchyard.status.trainingruns import TERMINAL

ENTRY_SELECTOR = f"app.kubernetes.io/component={planned.COMPONENT_ENTRY}"


def _index(ctx: Context, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's committed entries by key: their records, fetched bytes and last use."""
    found = {}
    for cm in ctx.k8s.list_(k8s.CONFIGMAPS, namespace, label_selector=ENTRY_SELECTOR):
        data = cm.get("data") or {}
        try:
            record = json.loads(data.get("entry") or "")
            found[str(record["key"])] = {
                "record": record,
                "fetchedBytes": int(data.get("fetchedBytes") or 0),
                "lastUsed": str(data.get("lastUsed") or ""),
            }
        except (ValueError, KeyError, TypeError):
            continue  # not one of ours as written: never taken for an entry
    return found


def pin_models(ctx: Context, run: api.TrainingRun, previous: Mapping[str, Any]) -> api.TrainingRun:
    """``run`` with each model:// input that names no version pinned: to the version its
    status recorded, else to the model's latest ModelVersion now (one the run then keeps;
    a model with none stays unpinned, and :func:`prepare` fails the run)."""
    loose = planned.unversioned(run)
    if not loose:
        return run
    known = planned.recorded_versions(previous)
    return planned.pinned(run, latest_versions(ctx, run.namespace, loose, known))


def latest_versions(
    ctx: Context, namespace: str, loose: Sequence[api.Input], known: Mapping[str, str]
) -> dict[str, str]:
    """``known`` (input name -> version) with each input of ``loose`` that it lacks pinned
    to its model's latest ModelVersion now (a model with none is left out)."""
    versions = dict(known)
    missing = [i for i in loose if i.name not in versions]
    if not missing:
        return versions
    specs = [v.get("spec") or {} for v in ctx.k8s.list_(k8s.MODELVERSIONS, namespace)]
    for inp in missing:
        model = uris.model_of(inp.uri)[0]
        numbers = [int(s.get("version") or 0) for s in specs if s.get("model") == model]
        if max(numbers, default=0) > 0:
            versions[inp.name] = str(max(numbers))
    return versions


def prepare(
    ctx: Context, run: api.TrainingRun, previous: Mapping[str, Any], logger: Log, now: datetime
) -> input_status.InputsObserved | None:
    """The run's fetched inputs: ready, being fetched, or failed (None: it has none)."""
    return prepare_sources(ctx, run.namespace, planned.fetched(run), previous, logger, now)


def prepare_sources(
    ctx: Context,
    namespace: str,
    wanted: Sequence[tuple[api.Input, uris.Source]],
    previous: Mapping[str, Any],
    logger: Log,
    now: datetime,
) -> input_status.InputsObserved | None:
    """The cache entries of ``wanted`` (a run's fetched inputs, an endpoint's model
    versions): ready, being fetched, or failed; ``previous``: the owner's status, whose
    ``inputs`` say what it waited for (None: nothing wanted)."""
    if not wanted:
        return None
    seen = {str(e.get("name")): e for e in previous.get("inputs") or []}
    index = _index(ctx, namespace)
    entries: list[dict[str, Any]] = []
    waiting: dict[str, str] = {}
    blocked: dict[str, tuple[str, str]] = {}
    failure = None
    for inp, source in wanted:
        before = seen.get(inp.name)
        key = source.key
        if _no_version(source, namespace):
            said = _no_version(source, namespace)
            failure = failure or input_status.failure(inp.name, source.uri, said)
            continue
        if key in index:
            entries.append(_ready(ctx, namespace, inp, index[key], before, now))
            continue
        entries.append({"name": inp.name, "uri": source.uri, "key": key})
        state, said = _fetch(ctx, namespace, source, index, before is not None, logger)
        if state == "Failed":
            failure = failure or input_status.failure(inp.name, source.uri, said)
        elif state == "Blocked":
            blocked[inp.name] = said
        elif state == "Complete":
            index[key] = _commit(ctx, namespace, said, now)
            entries[-1] = _ready(ctx, namespace, inp, index[key], before or {}, now)
        else:
            waiting[inp.name] = said
    return input_status.InputsObserved(entries, waiting, failure, blocked)


def _no_version(source: uris.Source, namespace: str) -> str:
    """What fails a model:// input that :func:`pin_models` could not pin ('' otherwise)."""
    if not schemes.of(source).unversioned(source.uri):
        return ""
    return (
        f"model {uris.model_of(source.uri)[0]} has no version in namespace {namespace} to "
        "start from: register one first (torchyard models list)"
    )


def ready_from_status(previous: Mapping[str, Any]) -> input_status.InputsObserved | None:
    """The inputs of a run whose gang has its Pods: ready, as its status says."""
    entries = list(previous.get("inputs") or [])
    return input_status.InputsObserved(entries) if entries else None


def _ready(
    ctx: Context,
    namespace: str,
    inp: api.Input,
    found: Mapping[str, Any],
    before: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The status entry of a ready input. Its fetched bytes: what this run saw fetched
    (it waited for the Job: ``before`` is its waiting entry), else 0 (the cache had it)."""
    record = found["record"]
    if before is None or before.get("digest") is None:
        fetched = int(found["fetchedBytes"]) if before is not None else 0
        if found["lastUsed"] != timestamp(now):  # first used by this run: the newest use
            entry = planned.entry_config_map(
                namespace, record, int(found["fetchedBytes"]), timestamp(now)
            )
            ctx.k8s.apply(entry)
    else:
        fetched = int(before.get("fetchedBytes") or 0)
    return {
        "name": inp.name,
        "uri": str(record["uri"]),
        "revision": str(record["revision"]),
        "digest": str(record["digest"]),
        "bytes": int(record["bytes"]),
        "fetchedBytes": fetched,
        "key": str(record["key"]),
    }


def _fetch(
    ctx: Context,
    namespace: str,
    source: uris.Source,
    index: Mapping[str, Any],
    waited: bool,
    logger: Log,
) -> tuple[str, Any]:
    """The key's fetch Job, started when there is none: (its state, what it said)."""
    name = names.input_fetch(source.key)
    job = ctx.k8s.get_or_none(k8s.JOBS, namespace, name)
    state = environment_builds.job_state(job) if job is not None else ""
    if state == "Failed" and not waited:
        # A Job that failed before this run asked: this run tries again.
        ctx.k8s.delete(k8s.JOBS, namespace, name, propagation="Background")
        return "Running", "a fetch that failed before is being retried"
    if job is None:
        evicted = _evict(ctx, namespace, index)
        ctx.k8s.apply(planned.cache_claim(namespace, ctx.settings.inputs_cache))
        ctx.k8s.apply(
            planned.fetch_job(
                namespace,
                source,
                image=ctx.settings.init_image,
                cache=ctx.settings.inputs_cache,
                evict=evicted,
                registry_url=ctx.settings.registry_url,
                registry_ca=ctx.settings.registry_ca,
            )
        )
        logger.info("input %s: fetching it in Job %s/%s", source.uri, namespace, name)
        return "Running", f"fetching {source.uri} (Job {name})"
    pods = ctx.k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={name}")
    if state == "Running":
        stuck = input_status.stuck_fetch(source.uri, source.secret, namespace, pods)
        if stuck is not None:
            return "Blocked", stuck
        return "Running", f"fetching {source.uri} (Job {name})"
    said = _fetcher_report(pods)
    if state == "Complete" and isinstance(said.get("entry"), dict):
        return "Complete", said
    error = said.get("error") or (
        "the fetch Job ended without saying what it fetched (see its Pod's log: "
        f"kubectl logs -n {namespace} job/{name})"
    )
    return "Failed", str(error)


def _fetcher_report(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON the fetcher wrote to its termination log (the last Pod's), else {}."""
    for pod in reversed(pods):
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message") or ""
            try:
                said = json.loads(message)
            except ValueError:
                if message:
                    return {"error": message.strip()[-2000:]}
                continue
            if isinstance(said, dict):
                return said
    return {}


def _commit(ctx: Context, namespace: str, said: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Index the entry a fetch Job committed."""
    record = dict(said["entry"])
    fetched = int(said.get("fetchedBytes") or 0)
    ctx.k8s.apply(planned.entry_config_map(namespace, record, fetched, timestamp(now)))
    return {"record": record, "fetchedBytes": fetched, "lastUsed": timestamp(now)}


def _seconds(stamp: str) -> float:
    try:
        when = parse_time(stamp)
    except ValueError:
        return 0.0
    return when.timestamp() if when is not None else 0.0


def _pinned(ctx: Context, namespace: str) -> set[str]:
    """The keys of the unfinished runs and of the endpoints of the namespace (their
    entries stay: the runs will read them, the serving Pods mount them)."""
    keys: set[str] = set()
    for body in ctx.k8s.list_(k8s.ONLINEENDPOINTS, namespace):
        keys.update(endpoint_plans.cache_keys(body))
    for body in ctx.k8s.list_(k8s.TRAININGRUNS, namespace):
        if (body.get("status") or {}).get("phase") in TERMINAL or not body["spec"].get("inputs"):
            continue
        try:
            run = api.parse_trainingrun(body)
            versions = planned.recorded_versions(body.get("status") or {})
            keys.update(planned.keys(planned.pinned(run, versions)).values())
        except api.InvalidSpec:
            continue
    return keys


def _evict(ctx: Context, namespace: str, index: Mapping[str, Any]) -> list[str]:
    """The least recently used entries that no unfinished run uses, out of the index until
    the entries fit under the cache's limit; the fetch Job deletes their folders."""
    entries = [
        (key, int(e["record"].get("bytes") or 0), _seconds(e["lastUsed"]))
        for key, e in index.items()
    ]
    limit = ctx.settings.inputs_cache.limit_bytes
    if sum(size for _, size, _ in entries) <= limit:
        return []
    try:
        chosen = cache.evictions(entries, limit, 0, sorted(_pinned(ctx, namespace)))
    except uris.InputError:
        return []  # the unfinished runs' entries fill it: nothing can go now
    for key in chosen:
        ctx.k8s.delete(k8s.CONFIGMAPS, namespace, names.input_entry(key))
    return chosen

"""The manifests of a run's inputs: the namespace's cache claim, a fetch Job per cache
key, the cache's index entries, and the node Pods' volumes, mounts and variables.

Pure builders. An input's cache entry is mounted read-only at the entry's ``data``
folder (``subPath``), so a run sees its own entries and nothing else of the cache; a
``download`` input is mounted at ``SOURCES/<name>`` and copied by the launcher into an
emptyDir at the input's path (``TORCHYARD_INPUTS_COPIES``); a ``pvc://`` input is its
claim, read-only. The fetch Job runs ``python -m torchyard.inputs.fetch`` in the torchyard
image: CPU only, non-root, Pod Security "restricted", no Kubernetes API token (a
``model://`` input gets the reading ServiceAccount's registry token, for the registry's
audience only; an ``s3://`` or ``hf://`` input gets its Secret's keys as variables, in
this Pod only: an s3 input's credentials required, the kubelet holds the Pod back
without them). Called by ``controller.inputs`` and ``planning.pods``; tested in
tests/unit/planning/test_inputs.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.api import Input, TrainingRun, TrainingRunSpec, wire
from torchyard.inputs import schemes, uris
from torchyard.inputs.base import RegistryService
from torchyard.inputs.cache import DATA
from torchyard.launch.contract import TORCHYARD_INPUTS_COPIES
from torchyard.planning import checkpoints, names

CACHE_MOUNT = "/cache"
SOURCES = "/torchyard/input-sources"
COMPONENT_FETCH = "input-fetch"
COMPONENT_ENTRY = "input-cache-entry"
LABEL_KEY = f"{wire.GROUP}/input-key"
# A fetch that fails for a reason of its own (exit 1: an InputError) fails its Job at
# once; a Pod killed on the way (evicted, its node lost) is tried again, and goes on from
# what it fetched (``torchyard.inputs.transfer``).
FETCH_RETRIES = 3
FETCH_TTL_SECONDS = 600
FETCHER_UID = 65532


@dataclass(frozen=True)
class CacheSettings:
    """The namespace's inputs cache, as the operator is configured (Helm chart)."""

    size: str = "50Gi"  # the claim's request
    limit_bytes: int = 45 * 2**30  # entries beyond it are evicted, least recently used first
    storage_class: str = ""  # "" = the cluster's default
    access_mode: str = "ReadWriteOnce"  # ReadWriteMany for runs on several nodes


def fetched(run: TrainingRun) -> list[tuple[Input, uris.Source]]:
    """The inputs the cache holds (all but pvc://), each with its fetcher's source."""
    reader = run.spec.service_account_name
    return [(i, i.source(reader)) for i in run.spec.inputs if schemes.of(i).FETCHED]


def unversioned(run: TrainingRun) -> list[Input]:
    """The model:// inputs that name no version (the latest, pinned before the fetch)."""
    return unversioned_of(run.spec.inputs)


def unversioned_of(inputs: Sequence[Input]) -> list[Input]:
    """The model:// inputs of ``inputs`` that name no version (a run's, a Sweep's trial's)."""
    return [i for i in inputs if schemes.of(i).unversioned(i.canonical_uri)]


def recorded_versions(status: Mapping[str, Any]) -> dict[str, str]:
    """The model versions a run's status recorded for its inputs, by name."""
    found = {}
    for entry in status.get("inputs") or []:
        try:
            version = uris.model_of(str(entry.get("uri") or ""))[1]
        except uris.InputError:
            continue
        if version:
            found[str(entry.get("name"))] = version
    return found


def pinned(run: TrainingRun, versions: Mapping[str, str]) -> TrainingRun:
    """``run`` with each unversioned model:// input pinned to ``versions[name]`` (those
    without one stay as they are)."""
    spec = pinned_spec(run.spec, versions)
    return run if spec is run.spec else run.model_copy(update={"spec": spec})


def pinned_spec(spec: TrainingRunSpec, versions: Mapping[str, str]) -> TrainingRunSpec:
    """A run's spec (or a Sweep's trial template) with each unversioned model:// input
    pinned to ``versions[name]``; the same object when none is."""
    loose = {i.name for i in unversioned_of(spec.inputs)}
    if not loose & set(versions):
        return spec
    inputs = [
        i.model_copy(update={"revision": versions[i.name]})
        if i.name in loose and i.name in versions
        else i
        for i in spec.inputs
    ]
    return spec.model_copy(update={"inputs": inputs})


def pins(inputs: Sequence[Input], versions: Mapping[str, str]) -> list[dict[str, str]]:
    """The unversioned model:// inputs of ``inputs`` that ``versions`` pins, as a status
    lists them (name, the pinned URI, the version): what :func:`recorded_versions` reads."""
    return [
        {
            "name": i.name,
            "uri": f"{i.uri.rstrip('/')}/{versions[i.name]}",
            "revision": versions[i.name],
        }
        for i in unversioned_of(inputs)
        if i.name in versions
    ]


def claims(run: TrainingRun) -> list[str]:
    """The claims of the run's pvc:// inputs (they must exist before its Pods do)."""
    return sorted({claim[0] for i in run.spec.inputs if (claim := schemes.of(i).claim(i.uri))})


def _labels(component: str, key: str = "") -> dict[str, str]:
    labels = {"app.kubernetes.io/managed-by": "torchyard", "app.kubernetes.io/component": component}
    if key:
        labels[LABEL_KEY] = key[:63]
    return labels


def cache_claim(namespace: str, settings: CacheSettings) -> dict[str, Any]:
    """The namespace's cache claim: kept after the runs (it is the cache)."""
    spec = checkpoints.claim_spec(settings.access_mode, settings.size, settings.storage_class)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": names.INPUTS_CLAIM,
            "namespace": namespace,
            "labels": _labels("inputs-cache"),
        },
        "spec": spec,
    }


def entry_config_map(
    namespace: str, record: Mapping[str, Any], fetched_bytes: int, last_used: str
) -> dict[str, Any]:
    """The index entry of a committed cache entry (what the fetch Job reported)."""
    key = str(record["key"])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.input_entry(key),
            "namespace": namespace,
            "labels": _labels(COMPONENT_ENTRY, key),
        },
        "data": {
            "entry": json.dumps(dict(record), sort_keys=True),
            "fetchedBytes": str(fetched_bytes),
            "lastUsed": last_used,
        },
    }


def fetch_args(source: uris.Source, limit_bytes: int, evict: list[str]) -> list[str]:
    args = ["--cache", CACHE_MOUNT, "--uri", source.uri, "--key", source.key]
    args += ["--max-bytes", str(limit_bytes)]
    if source.sha256:
        args += ["--sha256", source.sha256]
    for pattern in source.include:
        args += [f"--include={pattern}"]
    for pattern in source.exclude:
        args += [f"--exclude={pattern}"]
    if source.reader:
        args += ["--reader", source.reader]
    if source.secret:
        args += ["--secret", source.secret]
    for key in evict:
        args += ["--evict", key]
    return args


def fetch_job(
    namespace: str,
    source: uris.Source,
    *,
    image: str,
    cache: CacheSettings,
    evict: list[str],
    registry_url: str = "",
    registry_ca: str = "",
) -> dict[str, Any]:
    """The one fetch Job of ``source``'s key (see the module docstring)."""
    labels = _labels(COMPONENT_FETCH, source.key)
    container = {
        "name": "fetch",
        "image": image,
        "command": ["python3", "-m", "torchyard.inputs.fetch"],
        "args": fetch_args(source, cache.limit_bytes, evict),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "1Gi"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    fail_at_once = {"containerName": "fetch", "operator": "In", "values": [1]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.input_fetch(source.key),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            "backoffLimit": FETCH_RETRIES,
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": fail_at_once}]},
            "ttlSecondsAfterFinished": FETCH_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": _fetch_pod(namespace, source, container, registry_url, registry_ca),
            },
        },
    }


def _fetch_pod(
    namespace: str,
    source: uris.Source,
    container: dict[str, Any],
    registry_url: str,
    registry_ca: str,
) -> dict[str, Any]:
    """The fetch Pod around ``container``: the cache at CACHE_MOUNT, and what the input's
    scheme adds (a model's registry address and reader's token, an s3 input's credentials,
    the Hub's settings and token)."""
    service = RegistryService(registry_url, registry_ca, wire.REGISTRY_AUDIENCE)
    parts = schemes.of(source).fetch_pod(source, namespace, service)
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, *parts.env]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
        *parts.mounts,
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": names.INPUTS_CLAIM}},
        {"name": "tmp", "emptyDir": {}},
        *parts.volumes,
    ]
    container = {**container, "env": env, "volumeMounts": mounts}
    if parts.env_from:
        container["envFrom"] = list(parts.env_from)
    return {
        "serviceAccountName": parts.service_account or "default",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": FETCHER_UID,
            "runAsGroup": FETCHER_UID,
            "fsGroup": FETCHER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }


def _volume(index: int) -> str:
    return f"input-{index}"


def keys(run: TrainingRun) -> dict[str, str]:
    """The cache key of each fetched input, by name."""
    return {inp.name: source.key for inp, source in fetched(run)}


def volumes(run: TrainingRun) -> list[dict[str, Any]]:
    """The node Pod's volumes of ``run``'s inputs."""
    vols: list[dict[str, Any]] = []
    if fetched(run):
        vols.append(
            {
                "name": "inputs-cache",
                "persistentVolumeClaim": {"claimName": names.INPUTS_CLAIM, "readOnly": True},
            }
        )
    for index, inp in enumerate(run.spec.inputs):
        claim = schemes.of(inp).claim(inp.uri)
        if claim is not None:
            vols.append(
                {
                    "name": _volume(index),
                    "persistentVolumeClaim": {"claimName": claim[0], "readOnly": True},
                }
            )
        if inp.mode == "download":
            vols.append({"name": f"{_volume(index)}-copy", "emptyDir": {}})
    return vols


def mounts(run: TrainingRun) -> list[dict[str, Any]]:
    """The trainer container's mounts of ``run``'s inputs, all read-only but the copies."""
    by_name = keys(run)
    out: list[dict[str, Any]] = []
    for index, inp in enumerate(run.spec.inputs):
        at = f"{SOURCES}/{inp.name}" if inp.mode == "download" else inp.mount_path
        claim = schemes.of(inp).claim(inp.uri)
        if claim is not None:
            mount = {"name": _volume(index), "mountPath": at, "readOnly": True}
            if claim[1]:
                mount["subPath"] = claim[1]
        else:
            mount = {
                "name": "inputs-cache",
                "mountPath": at,
                "subPath": f"entries/{by_name[inp.name]}/{DATA}",
                "readOnly": True,
            }
        out.append(mount)
        if inp.mode == "download":
            out.append({"name": f"{_volume(index)}-copy", "mountPath": inp.mount_path})
    return out


def env(run: TrainingRun, paths: Mapping[str, str] | None = None) -> dict[str, str]:
    """TORCHYARD_INPUT_<NAME> of every input (``paths``: name -> folder, local mode's;
    else the Pod's), and TORCHYARD_INPUTS_COPIES, the copies the launcher makes."""
    out = {uris.env_name(i.name): (paths or {}).get(i.name, i.mount_path) for i in run.spec.inputs}
    copies = [
        [f"{SOURCES}/{i.name}", i.mount_path] for i in run.spec.inputs if i.mode == "download"
    ]
    if copies and paths is None:
        out[TORCHYARD_INPUTS_COPIES] = json.dumps(copies, separators=(",", ":"))
    return out

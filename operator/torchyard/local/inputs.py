"""A local run's inputs: fetched into this machine's inputs cache, with the cluster's keys.

``torchyard run --local`` fetches every input of the run before its launchers start,
through the same fetcher as the cluster's fetch Job (``torchyard.inputs.fetch``) into a
cache folder of the same layout (TORCHYARD_INPUTS_CACHE, default ``~/.torchyard/inputs``)
under the same keys, kept under TORCHYARD_INPUTS_CACHE_LIMIT (least recently used
entries go first). A ``model://`` input is read from the local registry (the folder
local runs register into), each file checked against its manifest's sha256; one that
names no version is the latest version there. A ``mount``
input is the cache entry itself; a ``download`` input a copy in the run's folder. A
``pvc://`` input names a claim of the cluster, which this machine cannot mount: refused.
Called by ``local.runs``; tested in tests/unit/local/test_inputs.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from torchyard.api import Input, TrainingRun
from torchyard.api.quantities import quantity
from torchyard.inputs import archives, cache, fetch, patterns, schemes, uris
from torchyard.inputs.cache import DATA, sha256_file
from torchyard.launch.contract import TORCHYARD_INPUTS_CACHE, TORCHYARD_INPUTS_CACHE_LIMIT
from torchyard.planning import inputs as planned
from torchyard.registry import Store

DEFAULT_LIMIT = "50Gi"


def default_cache() -> Path:
    return Path(os.environ.get(TORCHYARD_INPUTS_CACHE, "~/.torchyard/inputs")).expanduser()


def cache_limit() -> int:
    return int(quantity(os.environ.get(TORCHYARD_INPUTS_CACHE_LIMIT) or DEFAULT_LIMIT))


def _from_store(store: Store, namespace: str) -> fetch.Fetcher:
    """The model:// fetcher of local mode: the version's files from the local registry."""

    def fetch_model(
        source: uris.Source, staging: str, env: Mapping[str, str], max_bytes: int
    ) -> int:
        model, version = uris.model_of(source.uri)
        try:
            if not version:
                raise KeyError(f"model {namespace}/{model} has no versions")
            found = store.get(namespace, model, int(version))
        except KeyError as err:
            raise uris.InputError(
                f"{source.uri}: {err.args[0]} in the local registry ({store.root}): run "
                "the training that registers it locally first (torchyard models list --local)"
            ) from None
        copied = 0
        for f in found.manifest.get("files") or []:
            rel = archives.member_path(str(f["path"]))
            if not patterns.included(rel, source.include, source.exclude):
                continue
            copied += int(f["size"])
            if copied > max_bytes:
                raise uris.InputError(f"{source.uri} is over the inputs cache's limit")
            target = os.path.join(staging, DATA, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(found.path / rel, target)
            if sha256_file(target) != f["sha256"]:
                raise uris.InputError(
                    f"{source.uri} ({rel}): the local registry's copy does not match its "
                    "manifest (torchyard models verify --local)"
                )
        return copied

    return fetch_model


def latest(store: Store, namespace: str, inputs: Sequence[Input]) -> dict[str, str]:
    """The local registry's latest version of each model:// input of ``inputs`` that names
    none (a model with none is left out), by input name."""
    found = {}
    for inp in planned.unversioned_of(inputs):
        numbers = store.versions(namespace, uris.model_of(inp.uri)[0])
        if numbers:
            found[inp.name] = str(numbers[-1])
    return found


def fetch_all(
    run: TrainingRun,
    workdir: Path,
    store: Store,
    say: Callable[[str], None],
    root: Path | None = None,
) -> dict[str, str]:
    """Each input's folder, by name: fetched (or found) in the cache, a download copied
    into ``workdir/inputs``. InputError names the input that cannot be had."""
    root = (root or default_cache()).resolve()
    for inp in run.spec.inputs:
        refused = schemes.of(inp).NOT_LOCAL
        if refused:
            local = [f"{s.TYPE}://" for s in schemes.registered() if s.FORM and not s.NOT_LOCAL]
            raise uris.InputError(
                f"input {inp.name}: {refused}; use an {', '.join(local[:-1])} or {local[-1]} "
                "input, or run in the cluster"
            )
    run = planned.pinned(run, latest(store, run.namespace, run.spec.inputs))
    wanted = planned.fetched(run)
    keys = [source.key for _, source in wanted]
    for key in cache.local_evictions(str(root), cache_limit(), 0, keys) if keys else []:
        cache.remove(str(root), key)
    paths = {}
    models = _from_store(store, run.namespace)
    for inp, source in wanted:
        try:
            got = fetch.fetch(
                source,
                str(root),
                cache_limit(),
                fetcher=models if schemes.of(source).READS_REGISTRY else None,
            )
        except uris.InputError as err:
            raise uris.InputError(f"input {inp.name} ({source.uri}): {err}") from None
        say(
            f"input {inp.name}: {got.entry.bytes} bytes ready ({got.fetched_bytes} fetched)"
            f" in {cache.entry_dir(str(root), source.key)}"
        )
        data = cache.data_dir(str(root), source.key)
        if inp.mode == "download":
            copy = workdir / "inputs" / inp.name
            shutil.copytree(data, copy)
            data = str(copy)
        paths[inp.name] = data
    return paths

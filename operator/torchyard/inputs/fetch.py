"""Fetch one input into the cache: the schemes' one interface, and the fetch Job's entry.

:func:`fetch` takes the key's lock; an entry that is there and intact is a hit (nothing
fetched); else the scheme's fetcher (its registered ``InputScheme.fetch(source, staging,
env, max_bytes) -> bytes received``, ``inputs.schemes``) fills ``partial/<key>/data`` (and
may write the revision it resolved to ``partial/<key>/revision``), and ``cache.commit``
lists, hashes and renames it into ``entries/<key>`` in one step. A scheme whose content
may change under one URI (``s3``, ``hf``: its ``current(source, env)``) is asked for its
revision first, and an entry of another revision is fetched again. A failed fetch leaves the
staging folder for the next try to go on from (the fetchers never keep a file that
failed its check) and nothing in ``entries/``.

``python -m torchyard.inputs.fetch`` is the fetch Job's container (the torchyard image,
CPU only, no Kubernetes API token): it evicts the keys the operator chose, fetches, and
writes the outcome as JSON to the termination log, which the operator reads
(``{"entry": {...}, "fetchedBytes": N}`` or ``{"error": "..."}``). Local mode calls
:func:`fetch` itself. Standard library only, but for ``hf`` (which imports
``huggingface_hub`` when it fetches); tested in tests/unit/inputs/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torchyard.inputs import cache, schemes
from torchyard.inputs.base import InputError, Source
from torchyard.launch.contract import TERMINATION_LOG


@dataclass(frozen=True)
class Fetched:
    entry: cache.Entry
    fetched_bytes: int  # received over the network this time (0: a cache hit)


Fetcher = Callable[[Source, str, Mapping[str, str], int], int]


def fetch(
    source: Source,
    root: str,
    max_bytes: int,
    env: Mapping[str, str] | None = None,
    fetcher: Fetcher | None = None,
) -> Fetched:
    """The entry of ``source`` under ``root``, fetched unless it is there and intact;
    ``fetcher``: another one than the scheme's (local mode reads its own registry)."""
    schemes.parse(source.uri, source.sha256)
    if fetcher is None:
        scheme = schemes.of(source)
        if not scheme.FETCHED:
            raise InputError(f"{source.uri}: {source.scheme}:// inputs are mounted, not fetched")
        fetcher = scheme.fetch
    key = source.key
    env = dict(os.environ if env is None else env)
    with cache.locked(root, key):
        entry = cache.read(root, key)
        if entry is not None and _current(entry, source, env) and not cache.verify(root, entry):
            cache.touch(root, key)
            return Fetched(entry, 0)
        if entry is not None:
            cache.remove(root, key)  # damaged or out of date: fetched again
        staging = cache.staging_dir(root, key)
        os.makedirs(staging, exist_ok=True)
        received = fetcher(source, staging, env, max_bytes)
        return Fetched(cache.commit(root, source, _resolved(staging)), received)


def _current(entry: cache.Entry, source: Source, env: Mapping[str, str]) -> bool:
    """Whether the entry holds the source's revision as its store has it now."""
    now = schemes.of(source).current(source, env)
    return now is None or now == entry.revision


def _resolved(staging: str) -> str:
    try:
        with open(os.path.join(staging, "revision")) as f:
            return f.read().strip()
    except OSError:
        return ""


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchyard.inputs.fetch")
    p.add_argument("--cache", required=True, help="the cache's root folder")
    p.add_argument("--uri", required=True)
    p.add_argument("--sha256", default="")
    p.add_argument("--include", action="append", default=[])
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--reader", default="", help="the ServiceAccount reading a model://")
    p.add_argument("--secret", default="", help="the Secret an s3:// or hf:// input is read with")
    p.add_argument("--max-bytes", type=int, required=True)
    p.add_argument("--key", required=True, help="the key the operator expects")
    p.add_argument("--evict", action="append", default=[], help="keys to take away first")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, termination_log: str = TERMINATION_LOG) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    source = Source(
        args.uri, args.sha256, tuple(args.include), tuple(args.exclude), args.reader, args.secret
    )
    try:
        if source.key != args.key:
            raise InputError(
                f"the fetcher computes key {source.key} for {source.uri}, the operator "
                f"{args.key}: the operator and the fetch image are different versions"
            )
        for key in args.evict:
            cache.remove(args.cache, key)
        done = fetch(source, args.cache, args.max_bytes)
    except InputError as err:
        _write(termination_log, {"error": str(err)[:3000]})
        print(f"torchyard: cannot fetch {source.uri}: {err}", file=sys.stderr)
        return 1
    _write(termination_log, {"entry": done.entry.record(), "fetchedBytes": done.fetched_bytes})
    print(
        f"torchyard: {source.uri}: {done.entry.bytes} bytes ready, {done.fetched_bytes} fetched",
        file=sys.stderr,
    )
    return 0


def _write(path: str, info: Mapping[str, object]) -> None:
    try:
        with open(path, "w") as f:
            f.write(json.dumps(info, sort_keys=True))
    except OSError:
        pass


if __name__ == "__main__":
    raise SystemExit(main())

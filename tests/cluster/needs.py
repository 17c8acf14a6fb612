"""What the tests need made before they run, in the order ``make test`` makes it: the control
plane's Go tools, the real node (Debian packages, its Go tools, its images), SeaweedFS,
Kueue, syft, KServe's CRD and the Horovod image. Each is made once per version or inputs
into the cache outside the clone (a second process that wants it meanwhile waits for the
first: ``binaries.one_maker``), and never inside a test's timeout:

- ``python -m tests.cluster.needs [NAME ...]`` makes them (all by default), with progress
  lines: ``make setup``, and the first step of ``make test`` (``tests/tiers.py``), which
  starts each pytest run once what all its tests need is made, beside the later builds;
- in a pytest run (``tests/conftest.py``), a test that needs one of them (by its fixtures,
  :data:`FIXTURES`) waits for it, or makes it, before its timeout starts, and the modules
  of such tests run after the others, in this order, so that a run started while a later
  need is still being made reaches it last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@dataclass(frozen=True)
class Need:
    name: str
    what: str  # for the progress line
    make: Callable[[], object]
    root: bool = False  # only made (and only needed) as root


def _control_plane() -> None:
    from tests.cluster import binaries

    binaries.build_all()


def _real_node() -> None:
    from tests.cluster import realnode

    realnode.prepare()


def _tool(name: str) -> Callable[[], object]:
    def make() -> object:
        from tests.cluster import binaries

        return binaries.build(binaries.TOOLS[name])

    return make


def _kueue() -> None:
    from tests.cluster import kueue

    kueue.build()


def _kserve() -> None:
    from tests.cluster import kserve

    kserve.crd_file()


def _horovod() -> None:
    from tests.cluster import horovod_image

    horovod_image.ensure_horovod_image()


NEEDS: dict[str, Need] = {
    n.name: n
    for n in (
        Need("control-plane", "the control plane's Go tools", _control_plane),
        Need("real-node", "the real node's packages, Go tools and images", _real_node, root=True),
        Need("seaweedfs", "SeaweedFS (the S3 store)", _tool("seaweedfs")),
        Need("kueue", "Kueue's controller manager", _kueue),
        Need("syft", "syft (the release's SBOM)", _tool("syft")),
        Need("kserve", "KServe's Go module (its InferenceService CRD)", _kserve),
        Need("horovod", "the Horovod image", _horovod, root=True),
    )
}
# A test needs what its fixtures need (directly or through other fixtures).
FIXTURES = {
    "cluster": "control-plane",
    "real_node": "real-node",
    "seaweedfs": "seaweedfs",
    "kueue": "kueue",
    "manager_kueue": "kueue",  # tests/integration/test_multikueue.py: both clusters' Kueue
    "worker": "kueue",
    "syft": "syft",
    "with_kserve": "kserve",
    "horovod_env": "horovod",
}
# Made before the first test of a run that needs them (a session's cluster and node start
# with it); the others just before the first test that needs each.
FIRST = ("control-plane", "real-node")


def of(fixturenames: Iterable[str]) -> list[str]:
    """The needs of a test with these fixtures, in the order they are made."""
    wanted = {FIXTURES[f] for f in fixturenames if f in FIXTURES}
    root = os.geteuid() == 0
    return [n for n, need in NEEDS.items() if n in wanted and (root or not need.root)]


_made: set[str] = set()


def ensure(names: Iterable[str]) -> None:
    """Make (or wait for) each of ``names`` once in this process."""
    for name in names:
        if name not in _made:
            NEEDS[name].make()
            _made.add(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("needs", nargs="*", help=f"any of {', '.join(NEEDS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.needs if n not in NEEDS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}; choose from {', '.join(NEEDS)}")
    root = os.geteuid() == 0
    for name in args.needs or list(NEEDS):
        need = NEEDS[name]
        if need.root and not root:
            print(f"[setup] {need.what}: not as user {os.geteuid()} (the tests need root)")
            continue
        started = time.monotonic()
        print(f"[setup] {need.what} ...", flush=True)
        need.make()
        print(f"[setup] {need.what}: ready in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

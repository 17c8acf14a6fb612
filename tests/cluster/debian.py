"""The Debian side of the real test node: host packages and the mirror apt already uses.

The real node (``tests/cluster/realnode.py``) needs a container runtime and CNI plugins
on the host, and its base image is bootstrapped from Debian's own packages. Both come
from the Debian archive this machine already trusts, nothing else:

- ``ensure_packages()`` installs what is missing of ``HOST_PACKAGES`` with
  ``apt-get install -y --no-install-recommends`` (``apt-get update`` first only when apt
  knows no candidate for one of them), printing how long it took;
- ``debian_mirror()`` reads ``/etc/apt/sources.list`` and ``sources.list.d/`` (one-line
  and deb822 formats) for the mirror that serves this release's main suite, which
  ``tests/cluster/images.py`` hands to ``debootstrap``.

Called by ``tests/cluster/realnode.py`` and ``tests/cluster/images.py``; tested by
``tests/unit/cluster/test_debian.py`` (parsing) and ``tests/node/`` (for real).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlparse

# Debian package -> a file it installs (present = installed; dpkg is slower to ask).
HOST_PACKAGES: dict[str, str] = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "debootstrap": "/usr/sbin/debootstrap",
    "iptables": "/usr/sbin/iptables",
}
# OpenMPI and mpi4py for local mode's MPI runs (tests/e2e/test_local_mpi.py): the host's
# Debian python3 runs the mpi4py ranks under the local mpirun.
MPI_HOST_PACKAGES: dict[str, str] = {
    "openmpi-bin": "/usr/bin/mpirun",
    "libopenmpi-dev": "/usr/bin/mpicc",
    "python3-mpi4py": "/usr/lib/python3/dist-packages/mpi4py/__init__.py",
}
HOST_PACKAGES.update(MPI_HOST_PACKAGES)

APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")


class SetupError(RuntimeError):
    """The host cannot run the real node; the message says what to do."""


def missing_packages(packages: dict[str, str] | None = None) -> list[str]:
    return [name for name, path in (packages or HOST_PACKAGES).items() if not Path(path).exists()]


def ensure_packages(packages: dict[str, str] | None = None, *, log: bool = True) -> list[str]:
    """Install the missing ``packages`` (name -> a file it installs); returns those installed."""
    wanted = packages or HOST_PACKAGES
    missing = missing_packages(wanted)
    if not missing:
        if log:
            print(f"[node] Debian packages: {', '.join(wanted)} present", flush=True)
        return []
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SetupError(
            f"the real node needs the Debian packages {' '.join(missing)}: install them "
            f"(apt-get install -y --no-install-recommends {' '.join(missing)}) as root, "
            "or run the tests as root on Debian/Ubuntu so the harness installs them"
        )
    started = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if not all(_has_candidate(name) for name in missing):
        if log:
            print("[node] apt-get update (no candidate for some packages) ...", flush=True)
        _apt(["apt-get", "update", "-q"], env)
    if log:
        print(f"[node] apt-get install {' '.join(missing)} ...", flush=True)
    _apt(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env)
    still = missing_packages(wanted)
    if still:
        raise SetupError(f"apt-get installed {' '.join(missing)} but {still} are still missing")
    if log:
        print(f"[node] installed {' '.join(missing)} in {time.monotonic() - started:.0f}s")
    return missing


def _has_candidate(package: str) -> bool:
    out = subprocess.run(
        ["apt-cache", "policy", package], capture_output=True, text=True, check=False
    ).stdout
    return any(
        line.strip().startswith("Candidate:") and "(none)" not in line for line in out.splitlines()
    )


APT_LOCK = Path("/tmp/torchyard-apt.lock")


def _apt(cmd: list[str], env: dict[str, str]) -> None:
    """``cmd`` (apt-get), one at a time on this machine: ``make test`` runs two pytest
    processes side by side (tests/tiers.py), and dpkg refuses a second apt-get at once;
    apt's own wait covers anyone else's."""
    cmd = [cmd[0], "-o", "DPkg::Lock::Timeout=600", *cmd[1:]]
    with APT_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SetupError(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-2000:]}\n"
            "fix apt on this machine (network, sources, a held dpkg lock) and run again"
        )


# -- the mirror -----------------------------------------------------------------------


def parse_sources(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(uri, suites, components) of every ``deb`` entry in one-line or deb822 ``text``."""
    entries: list[tuple[str, list[str], list[str]]] = []
    stanza: dict[str, str] = {}

    def flush() -> None:
        types = stanza.get("types", "").split()
        enabled = stanza.get("enabled", "yes").strip().lower() != "no"
        if "deb" in types and enabled:
            for uri in stanza.get("uris", "").split():
                entries.append(
                    (uri, stanza.get("suites", "").split(), stanza.get("components", "").split())
                )
        stanza.clear()

    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue  # a comment line neither ends a deb822 stanza nor belongs to it
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            flush()
            continue
        words = line.split()
        if words[0] == "deb" and ":" not in words[0]:
            # one-line format: deb [options] uri suite component...
            rest = words[1:]
            if rest and rest[0].startswith("["):
                while rest and not rest[0].endswith("]"):
                    rest = rest[1:]
                rest = rest[1:]
            if len(rest) >= 2:
                entries.append((rest[0], [rest[1]], rest[2:]))
            continue
        if words[0] == "deb-src":
            continue
        if ":" in words[0] and not raw[0].isspace():
            key, _, value = line.partition(":")
            stanza[key.strip().lower()] = value.strip()
    flush()
    return entries


def pick_mirror(entries: Iterable[tuple[str, list[str], list[str]]], suite: str) -> str:
    """The first plain-HTTP(S) mirror serving ``suite``'s ``main`` component."""
    for uri, suites, components in entries:
        scheme = urlparse(uri).scheme
        if suite in suites and "main" in components and scheme in ("http", "https"):
            return uri.rstrip("/")
    raise SetupError(
        f"no http(s) Debian mirror for '{suite} main' in {APT_SOURCES} or {APT_SOURCES_DIR}/: "
        "add one (e.g. 'deb http://deb.debian.org/debian "
        f"{suite} main') or set TORCHYARD_DEBIAN_MIRROR"
    )


def release_codename(os_release: Path = Path("/etc/os-release")) -> str:
    for line in os_release.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and value.strip('"'):
            return value.strip('"')
    raise SetupError(f"{os_release} names no VERSION_CODENAME; set TORCHYARD_DEBIAN_SUITE")


def debian_suite() -> str:
    return os.environ.get("TORCHYARD_DEBIAN_SUITE") or release_codename()


def debian_mirror(suite: str | None = None) -> str:
    """The mirror apt uses for ``suite`` (default: this machine's release)."""
    suite = suite or debian_suite()
    override = os.environ.get("TORCHYARD_DEBIAN_MIRROR")
    if override:
        return pick_mirror([(override, [suite], ["main"])], suite)
    files = [APT_SOURCES] if APT_SOURCES.is_file() else []
    if APT_SOURCES_DIR.is_dir():
        files += sorted(p for p in APT_SOURCES_DIR.iterdir() if p.suffix in (".list", ".sources"))
    entries = [e for f in files for e in parse_sources(f.read_text(errors="replace"))]
    return pick_mirror(entries, suite)

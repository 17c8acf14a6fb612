"""Container images for the real test node, made on this machine from Debian packages.

No Docker and no public registry: the sandbox (``pause``) image is ``pause.c`` compiled
with ``gcc -static``; the other two are ``debootstrap --variant=minbase`` Debian root file
systems from the mirror apt already uses (``tests/cluster/debian.py``):

- ``python``: the base the Dockerfiles in ``images/`` build on, standing in for
  ``python:3.11-slim``: ``python3`` with the ``python`` link, ``pip`` (Debian's
  python3-pip, with ``EXTERNALLY-MANAGED`` removed so ``pip install`` works as in the
  official image) and ca-certificates;
- ``pytorch``: the CPU training image of the tests, the same packages plus Debian's
  ``python3-torch`` (1.13, CPU, gloo), ``python3-numpy``, and ``openmpi-bin`` (OpenMPI
  4.1) with ``python3-mpi4py`` for MPI runs.

Each is packed as a one-layer OCI image archive and cached **outside the clone**, keyed
by a hash of its inputs:

    ${TORCHYARD_CACHE:-~/.cache/torchyard}/images/<name>-<key>/image.tar

so a second session only imports the archive into the node's containerd
(``ctr -n k8s.io images import``). An image is referenced as
``torchyard.local/<name>:<key>``; Pods use it with ``imagePullPolicy: Never``.

The project's own images (``images/*/Dockerfile``) are built from the ``python`` image
with buildah by ``tests/cluster/buildah.py`` and cached the same way (``ensure_archive``).

Called by ``tests/cluster/realnode.py``; ``oci_archive`` and the cache keys are tested
by ``tests/unit/cluster/test_local_images.py``, the images themselves by ``tests/node/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster import binaries, debian

HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause.c"
REGISTRY_HOST = "torchyard.local"
# Bump when the way an image is made changes without its inputs changing.
RECIPE = "1"
# python:3.11-slim's equivalent: pip and ca-certificates too (debootstrap adds no Recommends)
PYTHON_PACKAGES = ("python3", "python-is-python3", "python3-pip", "ca-certificates")
# OpenMPI and mpi4py for MPI runs (distribution.type: mpi, tests/node/test_mpi.py); the
# packages are part of the image's key, so adding them made a new image.
MPI_PACKAGES = ("openmpi-bin", "python3-mpi4py")
TORCH_PACKAGES = (*PYTHON_PACKAGES, "python3-torch", "python3-numpy", *MPI_PACKAGES)
# Left out of the images as python:3.11-slim leaves them out (copyright files are kept).
DOC_DIRS = ("usr/share/man", "usr/share/info")
# Debian bookworm's python3-torch 1.13 under Python 3.11: torchrun's ``Std.from_str("0")``
# (its default --redirects/--tee) returns None, as 3.11 no longer iterates an IntFlag's
# zero member, so ``python -m torch.distributed.run`` stops at once with "'NoneType'
# object has no attribute 'get'". The training image carries upstream's fix (torch 2.0).
TORCHRUN_FILE = "usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/api.py"
TORCHRUN_BUG = (
    "            v = int(v)\n"
    "            for s in Std:\n"
    "                if s == v:\n"
    "                    return s\n"
)
TORCHRUN_FIX = "            s = Std(int(v))\n            if s in Std:\n                return s\n"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")


@dataclass(frozen=True)
class Image:
    """One locally made image: where its archive is cached and how Pods name it."""

    name: str
    key: str

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or not re.fullmatch(r"[0-9a-f]{12}", self.key):
            raise ValueError(
                f"image name {self.name!r} / key {self.key!r}: use lowercase letters, digits "
                "and single '.', '_' or '-' for the name and 12 hex digits for the key"
            )

    @property
    def ref(self) -> str:
        return f"{REGISTRY_HOST}/{self.name}:{self.key}"

    @property
    def cache_dir(self) -> Path:
        return binaries.cache_root() / "images" / f"{self.name}-{self.key}"

    @property
    def archive(self) -> Path:
        return self.cache_dir / "image.tar"

    def is_built(self) -> bool:
        return self.archive.is_file()


def input_key(*parts: str | bytes) -> str:
    """12 hex digits of a hash over the inputs that decide an image's content."""
    digest = hashlib.sha256()
    for part in (RECIPE, *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:12]


def oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


# -- the locally made images ---------------------------------------------------------


def pause_image() -> Image:
    gcc = _run(["gcc", "-dumpfullversion"]).strip() if shutil.which("gcc") else "no-gcc"
    return Image("pause", input_key(PAUSE_SOURCE.read_bytes(), gcc, oci_arch()))


def python_image(suite: str | None = None, mirror: str | None = None) -> Image:
    return _debian_image("python", PYTHON_PACKAGES, suite, mirror)


def pytorch_image(suite: str | None = None, mirror: str | None = None) -> Image:
    return _debian_image("pytorch", TORCH_PACKAGES, suite, mirror, TORCHRUN_BUG, TORCHRUN_FIX)


def _debian_image(
    name: str, packages: tuple[str, ...], suite: str | None, mirror: str | None, *extra: str
) -> Image:
    suite = suite or debian.debian_suite()
    mirror = mirror or debian.debian_mirror(suite)
    return Image(name, input_key(suite, mirror, " ".join(packages), oci_arch(), *extra))


def ensure_pause_image(*, log: bool = True) -> Image:
    image = pause_image()

    def make(rootfs: Path, work: Path) -> dict[str, Any]:
        if shutil.which("gcc") is None:
            raise debian.SetupError(
                "gcc is needed once to build the sandbox image: apt-get install gcc libc6-dev"
            )
        _run(["gcc", "-static", "-Os", "-s", "-o", str(rootfs / "pause"), str(PAUSE_SOURCE)])
        return {"Entrypoint": ["/pause"], "Env": [f"PATH={DEFAULT_PATH}"]}

    return _ensure(image, make, log=log)


def ensure_python_image(*, log: bool = True) -> Image:
    """The base of the project's Dockerfiles (``PYTHON_IMAGE``); about 40 s cold."""
    suite = debian.debian_suite()
    image = python_image(suite, debian.debian_mirror(suite))
    return _ensure_debian_image(image, PYTHON_PACKAGES, suite, log=log)


def ensure_pytorch_image(*, log: bool = True) -> Image:
    """The CPU training image of the tests (torch 1.13, gloo); about 2-4 minutes cold."""
    suite = debian.debian_suite()
    image = pytorch_image(suite, debian.debian_mirror(suite))
    return _ensure_debian_image(image, TORCH_PACKAGES, suite, patch_torchrun, log=log)


def _ensure_debian_image(
    image: Image,
    packages: tuple[str, ...],
    suite: str,
    *fixes: Callable[[Path], None],
    log: bool,
) -> Image:
    mirror = debian.debian_mirror(suite)

    def make(rootfs: Path, work: Path) -> dict[str, Any]:
        with _unmount_below(rootfs):
            result = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(packages)}",
                    suite,
                    str(rootfs),
                    mirror,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0:
            log_file = rootfs / "debootstrap" / "debootstrap.log"
            detail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
            raise debian.SetupError(
                f"debootstrap {suite} from {mirror} failed ({result.returncode}):\n"
                f"{result.stdout[-1000:]}{result.stderr[-1000:]}{detail}\n"
                "check that the mirror is reachable (TORCHYARD_DEBIAN_MIRROR overrides it)"
            )
        slim_rootfs(rootfs)
        for fix in fixes:
            fix(rootfs)
        return {
            "Env": [f"PATH={DEFAULT_PATH}", "LANG=C.UTF-8"],
            "Cmd": ["python3"],
        }

    return _ensure(image, make, log=log)


def slim_rootfs(rootfs: Path) -> None:
    """Make a bootstrapped root file system an image: leave out what a container runtime
    provides itself, caches and manual pages, and let ``pip install`` work as it does in
    the official Python images (no ``EXTERNALLY-MANAGED`` marker, PEP 668)."""
    for sub in ("dev", "proc", "sys", "run", "tmp", "var/cache/apt", "var/lib/apt/lists"):
        _empty(rootfs / sub)
    for sub in DOC_DIRS:
        _empty(rootfs / sub)
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    (rootfs / "tmp").chmod(0o1777)


def patch_torchrun(rootfs: Path) -> None:
    """Backport torch 2.0's fix of torchrun under Python 3.11 (see ``TORCHRUN_BUG``)."""
    path = rootfs / TORCHRUN_FILE
    text = path.read_text() if path.is_file() else ""
    if TORCHRUN_BUG in text:
        path.write_text(text.replace(TORCHRUN_BUG, TORCHRUN_FIX, 1))
        for stale in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
            stale.unlink()
    elif TORCHRUN_FIX not in text:
        raise debian.SetupError(
            f"{TORCHRUN_FILE} is not the one of python3-torch 1.13 this image fixes: check "
            "whether `python3 -m torch.distributed.run` works as it is, then update "
            "patch_torchrun in tests/cluster/images.py"
        )


def _empty(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _ensure(image: Image, make: Callable[[Path, Path], dict[str, Any]], *, log: bool) -> Image:
    """Make ``image`` from a root file system that ``make(rootfs, work)`` fills (returning
    the image's config), unless its archive is cached."""

    def write(archive: Path, work: Path) -> None:
        rootfs = work / "rootfs"
        rootfs.mkdir(mode=0o755)
        rootfs.chmod(0o755)  # the image's "/" (mkdtemp's umask would make it 0700)
        config = make(rootfs, work)
        oci_archive(rootfs, archive, image.ref, config)
        shutil.rmtree(rootfs)

    return ensure_archive(image, write, log=log)


def ensure_archive(image: Image, write: Callable[[Path, Path], None], *, log: bool = True) -> Image:
    """``image`` with its archive in the cache: kept when there, else ``write(archive,
    work)`` makes it in a private folder ``work`` and it is moved in (one rename, so a
    half-made archive is never found; a failure leaves nothing)."""
    if image.is_built():
        if log:
            print(f"[node] image {image.ref}: cached in {image.cache_dir}", flush=True)
        return image
    with binaries.one_maker(image.cache_dir, f"[node] image {image.ref}" if log else None):
        if image.is_built():
            return image
        return _write_archive(image, write, log)


def _write_archive(image: Image, write: Callable[[Path, Path], None], log: bool) -> Image:
    started = time.monotonic()
    if log:
        print(f"[node] making image {image.ref} ...", flush=True)
    image.cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{image.name}-", dir=image.cache_dir.parent))
    try:
        out = tmp / "out"
        out.mkdir()
        write(out / "image.tar", tmp)
        if not (out / "image.tar").is_file():
            raise debian.SetupError(f"making {image.ref} wrote no archive: see the log above")
        if image.cache_dir.exists():  # another session finished the same image first
            return image
        out.rename(image.cache_dir)
    finally:
        unmount_below(tmp)  # never remove what a builder left mounted from the host
        shutil.rmtree(tmp, ignore_errors=True)
    if log:
        size = image.archive.stat().st_size / 2**20
        print(f"[node] made {image.ref} ({size:.0f} MiB) in {time.monotonic() - started:.0f}s")
    for old in prune(image):
        if log:
            print(f"[node] removed the superseded image {old}", flush=True)
    return image


KEEP_PER_NAME = 3


def prune(image: Image, keep: int = KEEP_PER_NAME) -> list[Path]:
    """Remove all but the ``keep`` newest cached archives of ``image``'s name (every change
    under ``operator/`` makes a new torchyard image key); ``image`` itself always stays. The
    folders removed. Other names, and folders that are not ``<name>-<12 hex>``, are left."""
    folders = [
        p
        for p in image.cache_dir.parent.glob(f"{image.name}-*")
        if re.fullmatch(rf"{re.escape(image.name)}-[0-9a-f]{{12}}", p.name) and p.is_dir()
    ]
    folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    stale = [p for p in folders[keep:] if p != image.cache_dir]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


@contextlib.contextmanager
def _unmount_below(root: Path) -> Iterator[None]:
    """debootstrap mounts /proc (and more) in the target; never leave one behind."""
    try:
        yield
    finally:
        unmount_below(root)


def unmount_below(root: Path) -> None:
    """Detach every mount at or under ``root``, children first."""
    for mount in reversed(mounts_below(root)):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def mounts_below(root: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points at or under ``root``, parents before children (from mountinfo)."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    prefix = str(root).rstrip("/")
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: (p.count("/"), p))


# -- OCI image archives -------------------------------------------------------------


def oci_archive(rootfs: Path, out: Path, ref: str, config: dict[str, Any]) -> str:
    """Write ``rootfs`` as a one-layer OCI image archive named ``ref``; return its digest.

    The archive is an OCI image layout in a tar (``oci-layout``, ``index.json``,
    ``blobs/sha256/...``), with the ``io.containerd.image.name`` annotation that
    ``ctr images import`` names the image by. The layer is an uncompressed tar made by
    GNU tar (hard links, ownership and modes as they are on disk).
    """
    if not rootfs.is_dir():
        raise ValueError(f"{rootfs} is not a directory")
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        layer = Path(work) / "layer.tar"
        _run(["tar", "--numeric-owner", "--sort=name", "-C", str(rootfs), "-cf", str(layer), "."])
        layer_digest, layer_size = _sha256_file(layer)
        image_config = {
            "architecture": oci_arch(),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [{"created_by": "torchyard tests/cluster/images.py"}],
        }
        config_blob = _json(image_config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": "sha256:" + hashlib.sha256(config_blob).hexdigest(),
                "size": len(config_blob),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}",
                    "size": layer_size,
                }
            ],
        }
        manifest_blob = _json(manifest)
        manifest_digest = hashlib.sha256(manifest_blob).hexdigest()
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{manifest_digest}",
                    "size": len(manifest_blob),
                    "platform": {"architecture": oci_arch(), "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
            _add_bytes(tar, "index.json", _json(index))
            _add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_blob)
            _add_bytes(tar, "blobs/sha256/" + hashlib.sha256(config_blob).hexdigest(), config_blob)
            tar.add(layer, arcname=f"blobs/sha256/{layer_digest}")
    return f"sha256:{manifest_digest}"


def oci_layout_archive(layout: Path, out: Path, ref: str) -> str:
    """Pack the OCI image layout folder ``layout`` (one image, as ``buildah push oci:``
    writes it) as an archive that ``ctr images import`` names ``ref``; return its digest.

    Only what the index names is packed (the manifest, its config and layers), each blob
    checked against its digest; links and paths outside ``blobs/sha256`` are refused.
    """
    index = json.loads((layout / "index.json").read_text())
    entries = index.get("manifests", [])
    if len(entries) != 1:
        raise ValueError(f"{layout}: expected one image in index.json, found {len(entries)}")
    entry = dict(entries[0])
    manifest = json.loads(_layout_blob(layout, entry["digest"]).read_bytes())
    blobs = [entry["digest"], manifest["config"]["digest"]]
    blobs += [layer["digest"] for layer in manifest["layers"]]
    entry["annotations"] = {
        **entry.get("annotations", {}),
        "io.containerd.image.name": ref,
        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
    }
    entry.setdefault("platform", {"architecture": oci_arch(), "os": "linux"})
    new_index = {**index, "manifests": [entry]}
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(tar, "index.json", _json(new_index))
        for digest in dict.fromkeys(blobs):
            tar.add(_layout_blob(layout, digest), arcname=f"blobs/sha256/{digest[7:]}")
    return str(entry["digest"])


def _layout_blob(layout: Path, digest: str) -> Path:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"{layout}: {digest!r} is not a sha256 digest")
    path = layout / "blobs" / "sha256" / digest[7:]
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{layout}: blob {digest} is missing or not a plain file")
    if "sha256:" + _sha256_file(path)[0] != digest:
        raise ValueError(f"{layout}: blob {digest} does not match its digest")
    return path


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise debian.SetupError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def import_image(ctr_address: Path, image: Image, *, log: bool = True) -> None:
    """Import ``image``'s archive into containerd's ``k8s.io`` namespace (the CRI's)."""
    started = time.monotonic()
    cmd = ["ctr", "--address", str(ctr_address), "-n", "k8s.io", "images", "import"]
    result = subprocess.run([*cmd, str(image.archive)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise debian.SetupError(
            f"ctr images import {image.archive} failed: {result.stderr.strip()}\n"
            f"delete {image.cache_dir} to make the image again"
        )
    if log:
        size = image.archive.stat().st_size / 2**20
        print(f"[node] imported {image.ref} ({size:.0f} MiB) in {time.monotonic() - started:.1f}s")

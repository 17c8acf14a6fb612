"""The project's own images, built from ``images/*/Dockerfile`` with buildah: no Docker daemon.

``ensure_project_image("torchyard")`` builds ``images/operator/Dockerfile`` (the operator,
the registry service and the init containers) the way ``docker build`` would, from the
locally made ``python`` base (``tests/cluster/images.py``), and caches the result as an OCI
image archive beside the other images, keyed by a hash of everything the build reads:

    ${TORCHYARD_CACHE:-~/.cache/torchyard}/images/torchyard-<key>/image.tar

The key covers the Dockerfile, every file its ``COPY`` instructions take from the
repository (read from a private copy of the build context, so what is hashed is what is
built), the base image's key and the build arguments: a warm run builds nothing.

How a build runs:

- Debian's ``buildah`` (installed by ``debian.ensure_packages`` when missing) with
  ``--isolation chroot`` and ``vfs`` storage under a private root inside the build's
  temporary folder, never the system's ``/var/lib/containers`` (where containers/image
  would still keep a cache: buildah runs in a mount namespace that puts a private folder
  there, or, where the folder does not exist, it is removed again); its own
  ``storage.conf``, ``registries.conf`` (none: nothing is pulled), ``containers.conf`` and
  signature policy, and ``TMPDIR`` in the same folder; the folder is unmounted and removed
  afterwards;
- the base is pulled into that storage from its ``oci-archive:`` and named by
  ``--build-arg PYTHON_IMAGE=torchyard.local/python:<key>`` with ``--pull=never``;
- ``RUN`` steps reach PyPI like the host does: the host's pip cache is bind-mounted at
  ``/root/.cache/pip`` (the Dockerfile's wheel stage keeps pip's cache for this; the stage
  is thrown away, so the image carries none of it) and, when the host trusts a CA bundle
  of its own (a TLS-intercepting proxy), that bundle is bind-mounted over the image's for
  the build only (bind mounts are never part of a layer);
- the image is pushed to an OCI layout and packed as an archive whose index names it
  ``torchyard.local/<name>:<key>`` (``io.containerd.image.name``), which the real node
  imports with ``ctr images import`` like the locally made images.

Called by ``tests/cluster/realnode.py``; the pure parts are tested by
``tests/unit/cluster/test_buildah.py``, the built images by ``tests/node/test_images.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tests.cluster import binaries, debian, images

REPO = Path(__file__).resolve().parents[2]
BUILDAH_PACKAGES = {"buildah": "/usr/bin/buildah"}
# Bump when the way a project image is built changes without its inputs changing.
BUILD_RECIPE = "1"
# name -> the Dockerfile (relative to the repository) built here
DOCKERFILES = {
    "torchyard": "images/operator/Dockerfile",
    # the curated Environments, built by the release (tests/cluster/release.py) only
    "pytorch-cpu": "images/pytorch-cpu/Dockerfile",
    "pytorch-cuda": "images/pytorch-cuda/Dockerfile",
}
# Images of the tests only (never released), each built over the base its test names: the
# tests' PyTorch image with an MLflow client (tests/node/test_mlflow_on_node.py).
TEST_DOCKERFILES = {"pytorch-mlflow": "tests/node/mlflow/Dockerfile"}
# Never part of a build context: caches that Python and the tools leave in the tree.
IGNORED_NAMES = re.compile(
    r"^(__pycache__|\.mypy_cache|\.ruff_cache|\.pytest_cache|\.hypothesis|.*\.egg-info|.*\.py[co])$"
)
# The host's own CA bundle (Debian's path, also the one Debian's pip reads).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# containers/image keeps its blob-info cache here for root whatever the storage root is
# (buildah 1.28 does not move it): builds hide it behind a folder of their own.
SYSTEM_CONTAINERS = Path("/var/lib/containers")
BUILD_TIMEOUT = 1800


class BuildError(debian.SetupError):
    """An image could not be built; the message says what to do."""


# -- the build context ----------------------------------------------------------------


def dockerfile_sources(text: str) -> list[str]:
    """The repository paths that the ``COPY``/``ADD`` instructions of a Dockerfile read
    (not those ``--from`` another stage), checked to stay inside the build context."""
    sources: list[str] = []
    for raw in re.sub(r"\\\n", " ", text).splitlines():
        words = raw.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = words[1:]
        if any(a.startswith("--from") for a in args):
            continue
        paths = [a for a in args if not a.startswith("--")]
        if args[:1] and args[0].startswith("["):
            raise BuildError(f"{raw.strip()!r}: use the plain form COPY <src>... <dest>")
        for source in paths[:-1]:
            sources.append(context_path(source))
    return sources


def context_path(source: str) -> str:
    """``source`` as a normal path relative to the build context, or an error."""
    path = PurePosixPath(source)
    if source.startswith(("/", "~")) or "\\" in source or ".." in path.parts:
        raise BuildError(
            f"COPY source {source!r} leaves the build context: name a path inside the "
            "repository, relative to its root"
        )
    if re.search(r"[*?\[$]", source) or source.startswith(("http://", "https://")):
        raise BuildError(
            f"COPY source {source!r}: name files or folders (no wildcards, variables or "
            "URLs), so the image's cache key can list exactly what the build reads"
        )
    normal = str(path)
    return "." if normal in ("", ".") else normal


def context_files(repo: Path, sources: list[str]) -> list[str]:
    """Every file under ``sources`` (relative to ``repo``), sorted, caches left out.

    A link or anything but a plain file or folder is refused: the build would copy
    something the cache key cannot see (or something outside the repository)."""
    found: set[str] = set()
    root = repo.resolve()
    for source in sources:
        path = repo / source
        if not path.exists() and not path.is_symlink():
            raise BuildError(f"COPY source {source!r} does not exist in {repo}")
        stack = [path]
        while stack:
            current = stack.pop()
            rel = current.relative_to(repo).as_posix()
            if current.is_symlink():
                raise BuildError(
                    f"{rel} is a link: a build context holds plain files and folders "
                    "(copy the file it points to instead)"
                )
            if IGNORED_NAMES.match(current.name) and current != path:
                continue
            if current.is_dir():
                stack.extend(current.iterdir())
            elif current.is_file():
                if not current.resolve().is_relative_to(root):
                    raise BuildError(f"{rel} is outside {repo}")
                found.add(rel)
            else:
                raise BuildError(f"{rel} is neither a file nor a folder: remove it")
    return sorted(found)


def stage_context(repo: Path, files: list[str], dest: Path) -> None:
    """Copy ``files`` (relative to ``repo``) into ``dest``, keeping modes."""
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)


def context_digest(context: Path, files: list[str]) -> str:
    """A hash over the names, executable bits and contents of ``files`` in ``context``."""
    digest = hashlib.sha256()
    for rel in files:
        path = context / rel
        data = path.read_bytes()
        executable = b"x" if path.stat().st_mode & 0o111 else b"-"
        for part in (rel.encode(), executable, data):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def image_key(dockerfile: bytes, context: str, base: images.Image, args: dict[str, str]) -> str:
    return images.input_key(
        BUILD_RECIPE,
        dockerfile,
        context,
        base.ref,
        json.dumps(args, sort_keys=True),
        images.oci_arch(),
    )


# -- buildah --------------------------------------------------------------------------


@dataclass
class Buildah:
    """buildah with everything it keeps under ``root``: storage (vfs), run state,
    configuration, signature policy and temporary files."""

    root: Path
    log: bool = True

    def __post_init__(self) -> None:
        for sub in ("storage", "run", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "storage.conf").write_text(
            "[storage]\n"
            'driver = "vfs"\n'
            f'runroot = "{self.root / "run"}"\n'
            f'graphroot = "{self.root / "storage"}"\n'
        )
        (self.root / "registries.conf").write_text("unqualified-search-registries = []\n")
        (self.root / "containers.conf").write_text("")
        (self.root / "policy.json").write_text(
            json.dumps({"default": [{"type": "insecureAcceptAnything"}]})
        )

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            CONTAINERS_STORAGE_CONF=str(self.root / "storage.conf"),
            CONTAINERS_REGISTRIES_CONF=str(self.root / "registries.conf"),
            CONTAINERS_CONF=str(self.root / "containers.conf"),
            BUILDAH_ISOLATION="chroot",
            TMPDIR=str(self.root / "tmp"),
        )

    def command(self, *args: str) -> list[str]:
        buildah = [
            "buildah",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "vfs",
            *args,
        ]
        if not SYSTEM_CONTAINERS.is_dir():
            return buildah  # run() removes what buildah creates there
        # a mount namespace of buildah's own, where the system's folder is ours
        (self.root / "system").mkdir(exist_ok=True)
        bind = f'mount --bind "$0" {SYSTEM_CONTAINERS} && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind,
                str(self.root / "system"), *buildah]  # fmt: skip

    def run(self, *args: str, stream: bool = False) -> str:
        cmd = self.command(*args)
        created = not SYSTEM_CONTAINERS.exists()
        try:
            result = subprocess.run(
                cmd,
                env=self.env(),
                stdout=None if stream else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
                timeout=BUILD_TIMEOUT,
            )
        finally:
            if created and SYSTEM_CONTAINERS.is_dir():
                shutil.rmtree(SYSTEM_CONTAINERS, ignore_errors=True)
        if result.returncode != 0:
            raise BuildError(
                f"buildah {args[0]} failed ({result.returncode}):\n"
                f"{(result.stdout or '')[-4000:]}\n"
                "the output above says which step; a RUN step that cannot reach PyPI needs "
                "the network (or PIP_INDEX_URL in the Dockerfile's environment)"
            )
        return result.stdout or ""

    def pull_archive(self, image: images.Image) -> None:
        """Put a cached image archive into this storage under its ``ref``."""
        policy = f"--signature-policy={self.root / 'policy.json'}"
        image_id = self.run("pull", "--quiet", policy, f"oci-archive:{image.archive}")
        self.run("tag", image_id.strip().splitlines()[-1], image.ref)

    def build(
        self,
        dockerfile: Path,
        context: Path,
        tag: str,
        args: dict[str, str],
        volumes: list[str],
    ) -> None:
        flags = [
            "build",
            "--isolation=chroot",
            "--pull=never",
            f"--signature-policy={self.root / 'policy.json'}",
            f"--file={dockerfile}",
            f"--tag={tag}",
            *(f"--build-arg={k}={v}" for k, v in sorted(args.items())),
            *(f"--volume={v}" for v in volumes),
            str(context),
        ]
        self.run(*flags, stream=self.log)

    def push_layout(self, tag: str, layout: Path) -> None:
        policy = f"--signature-policy={self.root / 'policy.json'}"
        self.run("push", "--quiet", policy, "--format=oci", tag, f"oci:{layout}:{tag}")


def pip_cache_dir() -> Path:
    """The host's pip cache (``PIP_CACHE_DIR``, else ``$XDG_CACHE_HOME/pip``)."""
    if os.environ.get("PIP_CACHE_DIR"):
        return Path(os.environ["PIP_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "pip"


def build_volumes(pip_cache: Path, ca_bundle: Path = HOST_CA_BUNDLE) -> list[str]:
    """Bind mounts for the build's ``RUN`` steps: the pip cache, and the host's CA bundle
    (read-only) when it has one."""
    volumes = [f"{pip_cache}:/root/.cache/pip"]
    if ca_bundle.is_file():
        volumes.append(f"{ca_bundle}:/etc/ssl/certs/ca-certificates.crt:ro")
    return volumes


# -- the images -------------------------------------------------------------------------


def ensure_project_image(
    name: str = "torchyard",
    *,
    base: images.Image | None = None,
    repo: Path = REPO,
    log: bool = True,
) -> images.Image:
    """The image built from ``DOCKERFILES[name]`` (or ``TEST_DOCKERFILES[name]``) over the
    local ``python`` base (or ``base``), cached."""
    known = {**DOCKERFILES, **TEST_DOCKERFILES}
    if name not in known:
        raise BuildError(f"no Dockerfile for {name!r}: choose one of {sorted(known)}")
    dockerfile = repo / known[name]
    base = base or images.ensure_python_image(log=log)
    if not base.is_built():
        raise BuildError(f"the base image {base.ref} is not made: {base.archive} is missing")
    text = dockerfile.read_bytes()
    files = context_files(repo, dockerfile_sources(text.decode()))
    parent = binaries.cache_root() / "images"
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-context-", dir=parent))
    try:
        context = staging / "context"
        stage_context(repo, files, context)
        (staging / "Dockerfile").write_bytes(text)  # exactly the text the key covers
        args = {"PYTHON_IMAGE": base.ref}
        image = images.Image(name, image_key(text, context_digest(context, files), base, args))

        def write(archive: Path, work: Path) -> None:
            debian.ensure_packages(BUILDAH_PACKAGES, log=log)
            pip_cache = pip_cache_dir()
            pip_cache.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            tool = Buildah(work / "buildah", log=log)
            tool.pull_archive(base)
            volumes = build_volumes(pip_cache)
            tool.build(staging / "Dockerfile", context, image.ref, args, volumes)
            tool.push_layout(image.ref, work / "layout")
            images.oci_layout_archive(work / "layout", archive, image.ref)
            if log:
                print(f"[node] buildah built {image.ref} in {time.monotonic() - started:.0f}s")

        return images.ensure_archive(image, write, log=log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""The ``pytorch-horovod`` test image: the training image's packages (Debian's python3-torch
1.13, OpenMPI 4.1, mpi4py) plus Horovod built from PyPI's source against them, with
PyTorch, MPI and gloo (``examples/horovod``, ``tests/node/test_horovod.py``).

Horovod is compiled in a build root of its own (the training image's packages plus a
compiler, cmake, ``libtorch-dev``, ``libopenmpi-dev`` and ``pybind11-dev``: Debian's torch
headers include pybind11, which ``python3-torch`` does not carry), and its installed
package is copied into the image, which gets Horovod's runtime dependencies from Debian.
Nothing is downloaded but Debian packages and Horovod's source from PyPI. About 10-15
minutes on 2 cores the first time; cached by its inputs like the other images
(``tests/cluster/images.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.cluster import debian, images

HOROVOD_VERSION = "0.28.1"  # the newest on PyPI
RECIPE = "1"  # bump when the way the image is made changes without its inputs changing
# Horovod's runtime dependencies, from Debian (apt-get in the bootstrapped root: debootstrap's
# own dependency resolution fails to configure python3-pycparser).
RUNTIME_PACKAGES = (
    "python3-cloudpickle",
    "python3-cffi",
    "python3-packaging",
    "python3-psutil",
    "python3-yaml",
)
BUILD_PACKAGES = (
    "build-essential",
    "cmake",
    "python3-dev",
    "libtorch-dev",
    "libopenmpi-dev",
    "pybind11-dev",
)
HOROVOD_BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITH_MPI": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "MAKEFLAGS": "-j2",
}
SITE = "usr/local/lib/python3.11/dist-packages"
HOST_CA = "etc/ssl/certs/torchyard-host-ca.crt"


def horovod_image() -> images.Image:
    suite = debian.debian_suite()
    mirror = debian.debian_mirror(suite)
    return images._debian_image(
        "pytorch-horovod",
        (*images.TORCH_PACKAGES, *RUNTIME_PACKAGES),
        *(suite, mirror, HOROVOD_VERSION, RECIPE),
    )


def ensure_horovod_image(*, log: bool = True) -> images.Image:
    suite = debian.debian_suite()
    mirror = debian.debian_mirror(suite)
    image = horovod_image()

    def make(rootfs: Path, work: Path) -> dict[str, Any]:
        build = work / "build"
        build.mkdir(mode=0o755)
        debootstrap(build, images.TORCH_PACKAGES, suite, mirror)
        in_root(build, ["apt-get", "update", "-q"], log=log)
        in_root(build, apt_install(*RUNTIME_PACKAGES, *BUILD_PACKAGES), log=log)
        in_root(build, PIP_INSTALL, log=log, pip=True)
        debootstrap(rootfs, images.TORCH_PACKAGES, suite, mirror)
        in_root(rootfs, ["apt-get", "update", "-q"], log=log)
        in_root(rootfs, apt_install(*RUNTIME_PACKAGES), log=log)
        site = rootfs / SITE
        site.mkdir(parents=True, exist_ok=True)
        for path in (build / SITE).glob("horovod*"):
            shutil.copytree(path, site / path.name, symlinks=True)
        shutil.copy2(build / "usr/local/bin/horovodrun", rootfs / "usr/local/bin/horovodrun")
        shutil.rmtree(build)
        images.slim_rootfs(rootfs)
        images.patch_torchrun(rootfs)
        return {"Env": [f"PATH={images.DEFAULT_PATH}", "LANG=C.UTF-8"], "Cmd": ["python3"]}

    return images._ensure(image, make, log=log)


def debootstrap(rootfs: Path, packages: tuple[str, ...], suite: str, mirror: str) -> None:
    with images._unmount_below(rootfs):
        result = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                *(suite, str(rootfs), mirror),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise debian.SetupError(
            f"debootstrap {suite} from {mirror} failed ({result.returncode}):\n"
            f"{result.stdout[-1000:]}{result.stderr[-1000:]}\n"
            "check that the mirror is reachable (TORCHYARD_DEBIAN_MIRROR overrides it)"
        )


# --no-build-isolation: Horovod's setup finds torch in the Python it builds with
PIP_INSTALL = [
    *("pip", "install", "--break-system-packages", "--no-build-isolation", "--no-deps"),
    f"horovod=={HOROVOD_VERSION}",
]


def apt_install(*packages: str) -> list[str]:
    return ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]


def in_root(root: Path, command: list[str], *, log: bool, pip: bool = False) -> None:
    """``command`` in ``root`` (chroot, /proc mounted); ``pip``: with PyPI as this machine
    reaches it (its CA bundle: a proxy may sign with its own) and Horovod's build flags."""
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    shutil.copy2("/etc/resolv.conf", resolv, follow_symlinks=True)
    env = {
        "PATH": images.DEFAULT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    if pip:
        ca = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
        shutil.copy2(ca or "/etc/ssl/certs/ca-certificates.crt", root / HOST_CA)
        env["PIP_CERT"] = f"/{HOST_CA}"
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_INDEX_URL")})
        env.update(HOROVOD_BUILD_ENV)
    if log:
        print(f"[node] horovod image: {' '.join(command)}", flush=True)
    (root / "proc").mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        done = subprocess.run(
            ["chroot", str(root), *command], env=env, capture_output=True, text=True
        )
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)
        if saved is not None:
            resolv.write_bytes(saved)
        (root / HOST_CA).unlink(missing_ok=True)
    if done.returncode != 0:
        raise debian.SetupError(
            f"{' '.join(command)} in {root} failed ({done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )

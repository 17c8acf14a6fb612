"""The shipped ``torchyard/`` package folder of a node Pod, on disk: for the tests that run
the launcher as a Pod does. Laid out from the launcher ConfigMap's data by the volume's
``items``, as the kubelet mounts it (``planning.shipped``)."""

from __future__ import annotations

from pathlib import Path

from torchyard.planning import pods, shipped


def lay_out(root: Path) -> Path:
    """The package folder under ``root`` (``root/torchyard``, the Pod's SHIPPED_ROOT being
    ``root``), holding every shipped file at its path; returns the package folder."""
    data = pods.launcher_config_map("default")["data"]
    package = root / shipped.PACKAGE
    for item in shipped.items(pods.SHIPPED_MODULES):
        target = package / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
    return package


def launcher(package: Path) -> Path:
    """The launcher's entry point in a laid-out ``package`` (``planning.pods.LAUNCHER_PATH``)."""
    return package / Path(pods.LAUNCHER_PATH).relative_to(pods.SHIPPED_PACKAGE)

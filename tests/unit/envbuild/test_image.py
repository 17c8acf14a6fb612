"""The builder's image pieces (torchyard.envbuild), no registry: where pip put the
packages in the prefix (upstream and Debian layouts) and the manifest it pushes."""

from __future__ import annotations

import os
from pathlib import Path

from torchyard import envbuild


def touch(root: Path, *paths: str) -> None:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")


def test_upstream_python_puts_packages_in_site_packages(tmp_path: Path) -> None:
    touch(tmp_path, "lib/python3.11/site-packages/birdnet/__init__.py", "bin/chirp")
    assert envbuild.site_packages(str(tmp_path)) == str(tmp_path / "lib/python3.11/site-packages")
    assert envbuild.script_dirs(str(tmp_path)) == [str(tmp_path / "bin")]


def test_debian_python_puts_them_under_local_dist_packages(tmp_path: Path) -> None:
    # what Debian's python3-pip does with --prefix P (the posix_local scheme)
    touch(tmp_path, "local/lib/python3.11/dist-packages/birdnet/__init__.py", "local/bin/chirp")
    site = str(tmp_path / "local/lib/python3.11/dist-packages")
    assert envbuild.site_packages(str(tmp_path)) == site
    bins = envbuild.script_dirs(str(tmp_path))
    assert bins == [str(tmp_path / "bin"), str(tmp_path / "local/bin")]
    config = envbuild.new_config(
        {"config": {"Env": ["PATH=/usr/bin:/bin"]}},
        "sha256:" + "0" * 64,
        str(tmp_path),
        envbuild.site_packages(str(tmp_path)),
        {},
        {},
        bins,
    )
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["PYTHONPATH"] == site
    assert env["PATH"].split(os.pathsep) == [*bins, "/usr/bin", "/bin"]


def test_base_layers_keep_their_media_types_in_the_new_manifest() -> None:
    base = {
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": "sha256:a",
                "size": 1,
            },
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd",
                "digest": "sha256:b",
                "size": 2,
            },
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "digest": "sha256:c",
                "size": 3,
            },
        ]
    }
    ours = {"mediaType": envbuild.OCI_LAYER, "digest": "sha256:d", "size": 4}
    manifest = envbuild.new_manifest(base, "sha256:cfg", 5, ours, {"k": "v"})
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.oci.image.layer.v1.tar",  # uncompressed stays uncompressed
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        envbuild.OCI_LAYER,
    ]
    assert [layer["digest"] for layer in manifest["layers"]][-1] == "sha256:d"
    assert manifest["config"] == {
        "mediaType": envbuild.OCI_CONFIG,
        "digest": "sha256:cfg",
        "size": 5,
    }
    assert manifest["annotations"] == {"k": "v"}

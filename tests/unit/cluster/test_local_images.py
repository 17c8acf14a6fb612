"""Locally made node images (tests/cluster/images.py): archives, names, cache keys."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import images
from tests.cluster.images import Image


def read_archive(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with tarfile.open(path) as tar:
        blobs = {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }
    return json.loads(blobs["index.json"]), blobs


def layer_members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
        return {m.name: m for m in layer.getmembers()}


def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    (root / "usr" / "bin" / "hello").chmod(0o755)
    os.link(root / "usr" / "bin" / "hello", root / "usr" / "bin" / "hello2")
    (root / "etc").mkdir()
    (root / "etc" / "escape").symlink_to("/etc/shadow")  # stored as a link, never followed
    (root / "etc" / "up").symlink_to("../../../outside")
    return root


def test_an_archive_is_an_oci_layout_containerd_can_name(tmp_path: Path) -> None:
    out = tmp_path / "image.tar"
    digest = images.oci_archive(
        rootfs(tmp_path), out, "torchyard.local/t:0123456789ab", {"Cmd": ["x"]}
    )
    index, blobs = read_archive(out)
    assert json.loads(blobs["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "torchyard.local/t:0123456789ab"
    assert entry["platform"] == {"architecture": images.oci_arch(), "os": "linux"}
    # every blob is named by its content
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(blobs["blobs/sha256/" + digest.split(":")[1]])
    config = json.loads(blobs["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    (layer_ref,) = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer_ref["digest"]]  # uncompressed: same digest
    assert config["config"] == {"Cmd": ["x"]}
    members = layer_members(blobs["blobs/sha256/" + layer_ref["digest"][7:]])
    assert members["./etc/escape"].issym() and members["./etc/escape"].linkname == "/etc/shadow"
    assert members["./etc/up"].linkname == "../../../outside"
    assert members["./usr/bin/hello2"].islnk()
    assert members["./usr/bin/hello"].mode & 0o777 == 0o755


def test_an_archive_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        images.oci_archive(tmp_path / "missing", tmp_path / "x.tar", "torchyard.local/t:0", {})


def test_a_made_image_has_a_world_readable_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_CACHE", str(tmp_path / "cache"))
    image = Image("probe", images.input_key("probe"))

    def make(root: Path, work: Path) -> dict[str, Any]:
        (root / "file").write_text("x")
        return {}

    images._ensure(image, make, log=False)
    assert image.archive.is_relative_to(tmp_path / "cache" / "images")
    _, blobs = read_archive(image.archive)
    layer_name = next(n for n in blobs if n.startswith("blobs/") and len(blobs[n]) > 1024)
    # not mkdtemp's 0700, which would lock non-root Pods out of "/"
    assert layer_members(blobs[layer_name])["."].mode & 0o777 == 0o755
    calls = []
    images._ensure(image, lambda r, w: calls.append(r) or {}, log=False)
    assert calls == []  # cached: not made again
    assert not [p for p in image.cache_dir.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("name", "key"),
    [("../pause", "0123456789ab"), ("Pause", "0123456789ab"), ("a//b", "0123456789ab"),
     ("pause", "xyz"), ("pause", "0123456789ab/../x"), ("", "0123456789ab")],
)  # fmt: skip
def test_image_names_and_keys_are_checked(name: str, key: str) -> None:
    with pytest.raises(ValueError, match="12 hex digits"):
        Image(name, key)


def test_the_cache_key_covers_every_input_unambiguously() -> None:
    assert images.input_key("ab", "c") != images.input_key("a", "bc")
    assert images.input_key("a") == images.input_key("a")
    assert images.python_image("bookworm", "http://m/debian") != images.python_image(
        "bookworm", "http://other/debian"
    )
    assert images.python_image("bookworm", "http://m/debian").ref.startswith(
        "torchyard.local/python:"
    )


def test_the_pause_image_key_follows_its_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = images.pause_image()
    changed = tmp_path / "pause.c"
    changed.write_text(images.PAUSE_SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(images, "PAUSE_SOURCE", changed)
    assert images.pause_image().key != before.key


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:50 / /tmp/torchyard-node-ab/kubelet rw shared:40 - ext4 /dev/vda rw
91 90 0:51 / /tmp/torchyard-node-ab/kubelet/pods/u/volumes/k~projected/t rw - tmpfs tmpfs rw
92 22 0:52 / /tmp/torchyard-node-abc/kubelet rw - ext4 /dev/vda rw
93 22 0:53 / /tmp/torchyard-node-ab/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_below_a_folder_parents_first_and_no_sibling_prefixes() -> None:
    found = images.mounts_below(Path("/tmp/torchyard-node-ab"), MOUNTINFO)
    assert found == [
        "/tmp/torchyard-node-ab/kubelet",
        "/tmp/torchyard-node-ab/with space",
        "/tmp/torchyard-node-ab/kubelet/pods/u/volumes/k~projected/t",
    ]

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

from tests.cluster import debian, images
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


def test_the_python_base_behaves_like_the_official_slim_image_for_dockerfiles() -> None:
    # python, the python link, pip and CA certificates: what images/*/Dockerfile use
    assert {"python3", "python-is-python3", "python3-pip", "ca-certificates"} <= set(
        images.PYTHON_PACKAGES
    )


def test_the_training_image_is_the_base_plus_debians_torch_and_numpy() -> None:
    assert images.TORCH_PACKAGES[: len(images.PYTHON_PACKAGES)] == images.PYTHON_PACKAGES
    assert {"python3-torch", "python3-numpy"} <= set(images.TORCH_PACKAGES)
    python = images.python_image("bookworm", "http://m/debian")
    pytorch = images.pytorch_image("bookworm", "http://m/debian")
    assert pytorch.ref.startswith("torchyard.local/pytorch:") and pytorch.key != python.key
    assert images.pytorch_image("trixie", "http://m/debian") != pytorch


def test_a_bootstrapped_root_is_slimmed_and_pip_installs_like_the_official_image(
    tmp_path: Path,
) -> None:
    root = tmp_path / "rootfs"
    for sub in ("usr/lib/python3.11", "usr/share/man/man1", "usr/share/doc/python3",
                "var/cache/apt/archives", "tmp/x", "proc/1"):  # fmt: skip
        (root / sub).mkdir(parents=True)
    (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    (root / "usr/lib/python3.11/os.py").write_text("")
    (root / "usr/share/man/man1/python3.1.gz").write_bytes(b"x")
    (root / "usr/share/doc/python3/copyright").write_text("license")
    (root / "var/cache/apt/archives/python3.deb").write_bytes(b"x")
    images.slim_rootfs(root)
    assert not (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").exists()
    assert (root / "usr/lib/python3.11/os.py").exists()
    assert list((root / "usr/share/man").iterdir()) == []
    assert (root / "usr/share/doc/python3/copyright").read_text() == "license"  # kept
    assert list((root / "var/cache/apt").iterdir()) == []
    assert list((root / "proc").iterdir()) == [] and list((root / "tmp").iterdir()) == []
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_an_archive_is_only_moved_into_the_cache_once_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_CACHE", str(tmp_path / "cache"))
    image = Image("probe", images.input_key("archive"))

    def writes_nothing(archive: Path, work: Path) -> None:
        (work / "half").write_text("x")

    with pytest.raises(debian.SetupError, match="wrote no archive"):
        images.ensure_archive(image, writes_nothing, log=False)
    assert not image.is_built()
    assert list((tmp_path / "cache" / "images").iterdir()) == []


def test_the_training_image_backports_torchruns_python_311_fix(tmp_path: Path) -> None:
    path = tmp_path / images.TORCHRUN_FILE
    path.parent.mkdir(parents=True)
    (path.parent / "__pycache__").mkdir()
    stale = path.parent / "__pycache__" / "api.cpython-311.pyc"
    stale.write_bytes(b"compiled from the buggy source")
    before = "def from_str(cls, vm):\n        def to_std(v):\n" + images.TORCHRUN_BUG + "\n# end\n"
    path.write_text(before)
    images.patch_torchrun(tmp_path)
    after = path.read_text()
    assert images.TORCHRUN_BUG not in after and images.TORCHRUN_FIX in after
    assert after.endswith("\n# end\n") and not stale.exists()
    images.patch_torchrun(tmp_path)  # once fixed, left alone
    assert path.read_text() == after
    # the fix, run: it finds the zero member that Python 3.11's IntFlag loop skips
    from enum import IntFlag

    class Std(IntFlag):
        NONE = 0
        OUT = 1
        ERR = 2
        ALL = OUT | ERR

    def compiled(body: str) -> Any:
        scope: dict[str, Any] = {"Std": Std}
        exec("def to_std(v):\n" + body.replace(" " * 12, "    "), scope)
        return scope["to_std"]

    assert compiled(images.TORCHRUN_FIX)("0") is Std.NONE
    assert compiled(images.TORCHRUN_FIX)("3") is Std.ALL


def test_a_torch_the_fix_does_not_know_is_refused_with_advice(tmp_path: Path) -> None:
    with pytest.raises(debian.SetupError, match="not the one of python3-torch"):
        images.patch_torchrun(tmp_path)  # no such file: another python3-torch
    path = tmp_path / images.TORCHRUN_FILE
    path.parent.mkdir(parents=True)
    path.write_text("def to_std(v):\n    return Std(v)\n")
    with pytest.raises(debian.SetupError, match="then update patch_torchrun"):
        images.patch_torchrun(tmp_path)
    assert path.read_text() == "def to_std(v):\n    return Std(v)\n"


def test_only_the_newest_archives_of_a_name_stay_and_the_one_just_made_always_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_CACHE", str(tmp_path / "cache"))
    keys = [f"{i:012x}" for i in range(6)]
    made = [images.Image("torchyard", k) for k in keys]
    for age, image in enumerate(reversed(made)):  # made[0] is the oldest
        image.cache_dir.mkdir(parents=True)
        (image.cache_dir / "image.tar").write_bytes(b"x")
        os.utime(image.cache_dir, (1000.0 - age, 1000.0 - age))
    other = images.Image("python", "0" * 12).cache_dir
    other.mkdir(parents=True)
    os.utime(other, (1.0, 1.0))
    odd = other.parent / "torchyard-notakey"
    odd.mkdir()
    os.utime(odd, (1.0, 1.0))

    removed = images.prune(made[0], keep=3)  # the oldest one is the one just asked for

    left = sorted(p.name for p in other.parent.iterdir())
    assert sorted(p.name for p in removed) == [f"torchyard-{k}" for k in keys[1:3]]
    assert left == sorted(
        [
            "python-" + "0" * 12,
            "torchyard-notakey",
            *(f"torchyard-{k}" for k in (keys[0], *keys[3:])),
        ]
    )

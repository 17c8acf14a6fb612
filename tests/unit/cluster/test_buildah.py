"""The project's images built with buildah (tests/cluster/buildah.py), without buildah:
what a Dockerfile reads, the cache key over it, the private storage, and the build's
orchestration against a stand-in that records what buildah would have been asked."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import buildah, debian, images
from tests.cluster.buildah import BuildError
from tests.cluster.images import Image

REPO = Path(__file__).resolve().parents[3]


def test_the_operator_dockerfile_reads_these_repository_paths() -> None:
    text = (REPO / buildah.DOCKERFILES["torchyard"]).read_text()
    assert buildah.dockerfile_sources(text) == [
        "requirements.lock",
        "pyproject.toml",
        "README.md",
        "operator",
    ]


def test_the_mlflow_test_image_reads_only_its_pinned_client_and_is_never_released() -> None:
    path = buildah.TEST_DOCKERFILES["pytorch-mlflow"]
    assert "pytorch-mlflow" not in buildah.DOCKERFILES  # (the release builds those)
    assert buildah.dockerfile_sources((REPO / path).read_text()) == [
        "tests/node/mlflow/requirements.lock"
    ]
    pins = (REPO / "tests/node/mlflow/requirements.lock").read_text().splitlines()
    server = (REPO / "tests/integration/tracking/requirements.lock").read_text().splitlines()
    [client] = [line for line in server if line.startswith("mlflow-skinny==")]
    assert client in pins  # the server's own version
    assert all("==" in line for line in pins if line and not line.startswith("#"))


def test_sources_of_other_stages_and_continued_lines() -> None:
    text = "FROM x AS a\nCOPY --chown=1:1 a.txt \\\n  b/ /dst/\nCOPY --from=a /wheels /wheels\n"
    assert buildah.dockerfile_sources(text) == ["a.txt", "b"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("COPY ../secrets /x", "leaves the build context"),
        ("COPY operator/../../etc/passwd /x", "leaves the build context"),
        ("COPY /etc/shadow /x", "leaves the build context"),
        ("COPY ~/.ssh/id_rsa /x", "leaves the build context"),
        ("ADD https://example.com/x.tar /x", "no wildcards, variables or URLs"),
        ("COPY operator/*.py /x", "no wildcards, variables or URLs"),
        ("COPY ${SRC} /x", "no wildcards, variables or URLs"),
        ('COPY ["a", "/x"]', "plain form"),
    ],
)
def test_a_source_outside_or_unlisted_is_refused(line: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        buildah.dockerfile_sources(f"FROM x\n{line}\n")


def tree(root: Path) -> Path:
    (root / "operator" / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "operator" / "pkg" / "__init__.py").write_text("VERSION = 1\n")
    (root / "operator" / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (root / "operator" / "pkg" / "stale.pyc").write_bytes(b"junk")
    (root / "operator" / ".mypy_cache").mkdir()
    (root / "operator" / ".mypy_cache" / "x.json").write_text("{}")
    (root / "operator" / "pkg.egg-info").mkdir()
    (root / "operator" / "pkg.egg-info" / "PKG-INFO").write_text("x")
    (root / "tool.sh").write_text("#!/bin/sh\n")
    (root / "README.md").write_text("readme\n")
    (root / "unrelated.txt").write_text("not copied\n")
    return root


def test_context_files_are_what_copy_reads_without_caches(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo")
    files = buildah.context_files(repo, ["README.md", "operator"])
    assert files == ["README.md", "operator/pkg/__init__.py"]


@pytest.mark.parametrize("target", ["/etc/shadow", "../outside", "README.md"])
def test_a_link_in_the_context_is_refused(tmp_path: Path, target: str) -> None:
    repo = tree(tmp_path / "repo")
    (repo / "operator" / "pkg" / "link.py").symlink_to(target)
    with pytest.raises(BuildError, match="is a link"):
        buildah.context_files(repo, ["operator"])
    (repo / "linked").symlink_to(repo / "operator")
    with pytest.raises(BuildError, match="linked is a link"):
        buildah.context_files(repo, ["linked"])


def test_a_missing_source_or_a_fifo_is_refused(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo")
    with pytest.raises(BuildError, match="does not exist"):
        buildah.context_files(repo, ["requirements.lock"])
    os.mkfifo(repo / "operator" / "pipe")
    with pytest.raises(BuildError, match="neither a file nor a folder"):
        buildah.context_files(repo, ["operator"])


def test_the_context_digest_follows_names_contents_and_the_executable_bit(tmp_path: Path) -> None:
    repo = tree(tmp_path / "repo")
    files = ["README.md", "tool.sh"]
    first = buildah.context_digest(repo, files)
    assert buildah.context_digest(repo, files) == first
    (repo / "tool.sh").chmod(0o755)
    second = buildah.context_digest(repo, files)
    assert second != first
    (repo / "README.md").write_text("readme!\n")
    assert buildah.context_digest(repo, files) != second
    (repo / "other.md").write_text("readme!\n")
    assert buildah.context_digest(repo, ["other.md", "tool.sh"]) != buildah.context_digest(
        repo, files
    )


def test_the_image_key_covers_dockerfile_context_base_and_arguments() -> None:
    base = Image("python", "0123456789ab")
    key = buildah.image_key(b"FROM x", "c" * 64, base, {"A": "1"})
    assert len(key) == 12
    assert buildah.image_key(b"FROM x", "c" * 64, base, {"A": "1"}) == key
    assert buildah.image_key(b"FROM y", "c" * 64, base, {"A": "1"}) != key
    assert buildah.image_key(b"FROM x", "d" * 64, base, {"A": "1"}) != key
    assert (
        buildah.image_key(b"FROM x", "c" * 64, Image("python", "ba9876543210"), {"A": "1"}) != key
    )
    assert buildah.image_key(b"FROM x", "c" * 64, base, {"A": "2"}) != key


def test_buildah_keeps_everything_under_its_own_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(buildah, "SYSTEM_CONTAINERS", tmp_path / "absent")
    tool = buildah.Buildah(tmp_path / "b")
    cmd = tool.command("images")
    assert cmd[:7] == [
        "buildah",
        "--root",
        str(tmp_path / "b" / "storage"),
        "--runroot",
        str(tmp_path / "b" / "run"),
        "--storage-driver",
        "vfs",
    ]
    env = tool.env()
    storage = Path(env["CONTAINERS_STORAGE_CONF"]).read_text()
    assert 'driver = "vfs"' in storage and "/var/lib/containers" not in storage
    for key in ("CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINERS_CONF"):
        assert Path(env[key]).is_relative_to(tmp_path / "b")
    assert Path(env["TMPDIR"]).is_relative_to(tmp_path / "b")
    assert env["BUILDAH_ISOLATION"] == "chroot"
    policy = json.loads((tmp_path / "b" / "policy.json").read_text())
    assert policy == {"default": [{"type": "insecureAcceptAnything"}]}


def test_build_volumes_mount_the_pip_cache_and_the_hosts_ca_bundle_read_only(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "ca.crt"
    assert buildah.build_volumes(tmp_path / "pip", bundle) == [
        f"{tmp_path / 'pip'}:/root/.cache/pip"
    ]
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert buildah.build_volumes(tmp_path / "pip", bundle)[1] == (
        f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro"
    )


def test_the_pip_cache_is_the_hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pc"))
    assert buildah.pip_cache_dir() == tmp_path / "pc"
    monkeypatch.delenv("PIP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert buildah.pip_cache_dir() == tmp_path / "xdg" / "pip"


# -- the build's orchestration, with a stand-in for buildah ----------------------------


def write_layout(layout: Path, layers: list[bytes]) -> None:
    """An OCI layout with one image, as ``buildah push oci:`` writes it."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    config = put(b'{"architecture":"amd64","os":"linux"}')
    layer_refs = [{"digest": put(data), "size": len(data)} for data in layers]
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": config}, "layers": layer_refs})
    digest = put(manifest.encode())
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "manifests": [{"digest": digest, "size": len(manifest)}]})
    )


class FakeBuildah:
    """Records what buildah would be asked and writes a layout where it would push."""

    calls: list[tuple[str, Any]] = []

    def __init__(self, root: Path, log: bool = True) -> None:
        self.root = root
        root.mkdir(parents=True)

    def pull_archive(self, image: Image) -> None:
        self.calls.append(("pull", image.ref))

    def build(
        self, dockerfile: Path, context: Path, tag: str, args: dict[str, str], volumes: list[str]
    ) -> None:
        files = sorted(p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file())
        self.calls.append(("build", (dockerfile.read_text(), files, tag, args, volumes)))

    def push_layout(self, tag: str, layout: Path) -> None:
        self.calls.append(("push", tag))
        write_layout(layout, [b"layer-" + tag.encode()])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[FakeBuildah]:
    monkeypatch.setenv("TORCHYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip"))
    monkeypatch.setattr(buildah, "Buildah", FakeBuildah)
    monkeypatch.setattr(debian, "ensure_packages", lambda *a, **k: [])
    FakeBuildah.calls = []
    return FakeBuildah


def fake_repo(root: Path) -> Path:
    repo = tree(root)
    (repo / "images" / "operator").mkdir(parents=True)
    (repo / "images" / "operator" / "Dockerfile").write_text(
        "ARG PYTHON_IMAGE=python:3.11.14-slim-trixie\nFROM ${PYTHON_IMAGE}\n"
        "COPY README.md ./\nCOPY operator ./operator\nUSER 65532:65532\n"
    )
    return repo


def base_image() -> Image:
    base = Image("python", "0123456789ab")
    base.cache_dir.mkdir(parents=True)
    base.archive.write_bytes(b"archive")
    return base


def test_a_project_image_is_built_once_from_exactly_its_inputs(
    fake: type[FakeBuildah], tmp_path: Path
) -> None:
    repo, base = fake_repo(tmp_path / "repo"), base_image()
    image = buildah.ensure_project_image(base=base, repo=repo, log=False)
    assert image.ref.startswith("torchyard.local/torchyard:")
    steps = [name for name, _ in fake.calls]
    assert steps == ["pull", "build", "push"]
    assert fake.calls[0] == ("pull", base.ref)
    dockerfile, files, tag, args, volumes = fake.calls[1][1]
    assert dockerfile == (repo / "images" / "operator" / "Dockerfile").read_text()
    assert files == ["README.md", "operator/pkg/__init__.py"]  # no caches, nothing else
    assert (tag, args) == (image.ref, {"PYTHON_IMAGE": base.ref})
    assert volumes[0] == f"{tmp_path / 'pip'}:/root/.cache/pip"
    with tarfile.open(image.archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == image.ref
    # warm: the same inputs build nothing, caches changing is no change
    fake.calls.clear()
    (repo / "operator" / "pkg" / "__pycache__" / "y.pyc").write_bytes(b"more junk")
    (repo / "unrelated.txt").write_text("changed, but not copied\n")
    assert buildah.ensure_project_image(base=base, repo=repo, log=False) == image
    assert fake.calls == []
    # a changed source file is a new image
    (repo / "operator" / "pkg" / "__init__.py").write_text("VERSION = 2\n")
    changed = buildah.ensure_project_image(base=base, repo=repo, log=False)
    assert changed.key != image.key and [n for n, _ in fake.calls] == ["pull", "build", "push"]
    # and no staging or half-made folder is left behind
    assert not [p for p in image.cache_dir.parent.iterdir() if p.name.startswith(".")]


def test_a_failed_build_leaves_nothing_and_says_so(
    fake: type[FakeBuildah], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, base = fake_repo(tmp_path / "repo"), base_image()

    def fails(*args: object) -> None:
        raise BuildError("buildah build failed (1): RUN pip wheel ...")

    monkeypatch.setattr(FakeBuildah, "build", fails)
    with pytest.raises(BuildError, match="buildah build failed"):
        buildah.ensure_project_image(base=base, repo=repo, log=False)
    assert sorted(p.name for p in base.cache_dir.parent.iterdir()) == [base.cache_dir.name]


def test_an_unknown_image_or_a_missing_base_is_refused(
    fake: type[FakeBuildah], tmp_path: Path
) -> None:
    repo = fake_repo(tmp_path / "repo")
    with pytest.raises(BuildError, match="choose one of"):
        buildah.ensure_project_image("../operator", repo=repo, log=False)
    with pytest.raises(BuildError, match="is not made"):
        buildah.ensure_project_image(base=Image("python", "ffffffffffff"), repo=repo, log=False)
    assert fake.calls == []


# -- packing a pushed layout ----------------------------------------------------------


def test_a_layout_becomes_an_archive_containerd_names(tmp_path: Path) -> None:
    write_layout(tmp_path / "layout", [b"one", b"two"])
    (tmp_path / "layout" / "blobs" / "sha256" / ("0" * 64)).write_bytes(b"not referenced")
    digest = images.oci_layout_archive(
        tmp_path / "layout", tmp_path / "image.tar", "torchyard.local/t:0123456789ab"
    )
    with tarfile.open(tmp_path / "image.tar") as tar:
        names = tar.getnames()
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"] == {
        "io.containerd.image.name": "torchyard.local/t:0123456789ab",
        "org.opencontainers.image.ref.name": "0123456789ab",
    }
    assert entry["platform"] == {"architecture": images.oci_arch(), "os": "linux"}
    assert f"blobs/sha256/{'0' * 64}" not in names  # only what the image references
    assert len([n for n in names if n.startswith("blobs/")]) == 4  # manifest, config, 2 layers


def test_a_layout_with_a_bad_blob_is_refused(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [b"layer"])
    index = json.loads((layout / "index.json").read_text())
    manifest_path = layout / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]
    layer = json.loads(manifest_path.read_text())["layers"][0]["digest"][7:]
    (layout / "blobs" / "sha256" / layer).write_bytes(b"tampered")
    with pytest.raises(ValueError, match="does not match its digest"):
        images.oci_layout_archive(layout, tmp_path / "a.tar", "torchyard.local/t:0123456789ab")
    (layout / "blobs" / "sha256" / layer).unlink()
    (layout / "blobs" / "sha256" / layer).symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="not a plain file"):
        images.oci_layout_archive(layout, tmp_path / "a.tar", "torchyard.local/t:0123456789ab")


@pytest.mark.parametrize(
    "digest", ["sha256:../../../etc/passwd", "sha512:" + "0" * 128, "sha256:" + "A" * 64]
)
def test_a_layout_naming_a_blob_by_a_non_digest_is_refused(tmp_path: Path, digest: str) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [b"layer"])
    (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": digest}]}))
    with pytest.raises(ValueError, match="is not a sha256 digest"):
        images.oci_layout_archive(layout, tmp_path / "a.tar", "torchyard.local/t:0123456789ab")


def test_a_layout_with_several_images_is_refused(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [b"layer"])
    index = json.loads((layout / "index.json").read_text())
    index["manifests"] *= 2
    (layout / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="expected one image"):
        images.oci_layout_archive(layout, tmp_path / "a.tar", "torchyard.local/t:0123456789ab")


def test_buildah_never_leaves_anything_in_the_systems_containers_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "var-lib-containers"
    monkeypatch.setattr(buildah, "SYSTEM_CONTAINERS", system)
    tool = buildah.Buildah(tmp_path / "b")
    ran: list[list[str]] = []

    class Done:
        returncode, stdout = 0, "ok"

    def fake_run(cmd: list[str], **kwargs: object) -> Done:
        ran.append(cmd)
        (system / "cache").mkdir(parents=True, exist_ok=True)  # what containers/image does
        (system / "cache" / "blob-info-cache-v1.boltdb").write_bytes(b"x")
        return Done()

    monkeypatch.setattr(buildah.subprocess, "run", fake_run)
    # absent before: whatever buildah made there is removed again
    assert tool.run("images") == "ok"
    assert ran[-1][0] == "buildah" and not system.exists()
    # present before (another tool's): buildah runs where a private folder hides it
    system.mkdir()
    (system / "theirs").write_text("kept")
    cmd = tool.command("images")
    assert cmd[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert f'mount --bind "$0" {system}' in cmd[7] and cmd[8] == str(tmp_path / "b" / "system")
    assert cmd[9:12] == ["buildah", "--root", str(tmp_path / "b" / "storage")]
    tool.run("images")
    assert (system / "theirs").read_text() == "kept"  # left alone

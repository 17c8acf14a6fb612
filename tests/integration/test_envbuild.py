"""The unprivileged builder against a real OCI registry: a base image made with the
project's own client, a wheel made by the test installed offline, the image pushed,
pulled back and checked; building twice gives the same layer."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.builders import wheel
from tests.cluster.registry import OciRegistry
from torchyard import envbuild
from torchyard.envbuild import Registry

ENVBUILD = Path(envbuild.__file__)


def make_wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel with a console script, made by hand (offline)."""
    module = "def hello():\n    return 'chirp'\n"
    return wheel(folder, "birdnet", "1.0", module, "chirp = birdnet:hello")


def push_base_image(reg: OciRegistry, repo: str = "base", tag: str = "1") -> str:
    """A small base image (one layer with /etc/os-release) pushed with our client."""
    client = Registry(reg.host)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = b"NAME=torchyard-test\n"
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    layer = gzip.compress(tar_bytes, mtime=0)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    client.upload(repo, layer_digest, io.BytesIO(layer), len(layer))
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(tar_bytes).hexdigest()],
            },
        }
    ).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    client.upload(repo, config_digest, io.BytesIO(config), len(config))
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": envbuild.OCI_MANIFEST,
            "config": {
                "mediaType": envbuild.OCI_CONFIG,
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {"mediaType": envbuild.OCI_LAYER, "digest": layer_digest, "size": len(layer)}
            ],
        }
    ).encode()
    client.put_manifest(repo, tag, manifest, envbuild.OCI_MANIFEST)
    return f"{reg.host}/{repo}:{tag}"


def run_builder(
    base: str, target: str, wheels: Path, prefix: Path, tmp: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The build Pod's command, as a local process (python = the 'base image's' Python)."""
    shutil.rmtree(prefix, ignore_errors=True)
    return subprocess.run(
        [
            sys.executable,
            str(ENVBUILD),
            "--base",
            base,
            "--target",
            target,
            "--pip",
            "birdnet",
            "--pip-arg=--no-index",
            f"--pip-arg=--find-links={wheels}",
            "--env",
            "BIRDS=1",
            "--label",
            f"{envbuild.HASH_LABEL}=sha256:abc",
            "--prefix",
            str(prefix),
            "--termination-log",
            str(tmp / "termination.json"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def pull(reg: OciRegistry, repo: str, ref: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    client = Registry(reg.host)
    manifest, _, _ = client.manifest(repo, ref)
    config = json.loads(client.blob(repo, manifest["config"]["digest"]).read())
    layer = client.blob(repo, manifest["layers"][-1]["digest"]).read()
    return manifest, config, layer


def test_builder_installs_offline_packs_and_pushes(
    oci_registry: OciRegistry, tmp_path: Path
) -> None:
    base = push_base_image(oci_registry)
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    prefix = tmp_path / "opt" / "torchyard" / "env"
    target = f"{oci_registry.host}/envs:sha256-abc"
    done = run_builder(base, target, wheels, prefix, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    image = json.loads((tmp_path / "termination.json").read_text())["image"]
    assert image.startswith(f"{oci_registry.host}/envs@sha256:")

    manifest, config, layer = pull(oci_registry, "envs", "sha256-abc")
    assert len(manifest["layers"]) == 2, "base layer + the new layer"
    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:gz") as tar:
        names = tar.getnames()
        members = tar.getmembers()
    site = next(n for n in names if n.endswith("site-packages/birdnet/__init__.py"))
    assert site.startswith(str(prefix).lstrip("/"))
    assert any(n.endswith("bin/chirp") for n in names)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
    assert not any(n.endswith(".pyc") for n in names)
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["PATH"].startswith(f"{prefix}/bin:")
    assert env["PYTHONPATH"] == "/" + site.rsplit("/birdnet/", 1)[0]
    assert env["BIRDS"] == "1" and env["LANG"] == "C.UTF-8"
    assert config["config"]["Labels"][envbuild.HASH_LABEL] == "sha256:abc"
    assert len(config["rootfs"]["diff_ids"]) == 2

    # Same inputs, same layer digest (a fresh prefix, a second build).
    again = run_builder(base, f"{oci_registry.host}/envs:again", wheels, prefix, tmp_path)
    assert again.returncode == 0, again.stderr
    second, _, _ = pull(oci_registry, "envs", "again")
    assert second["layers"][-1]["digest"] == manifest["layers"][-1]["digest"]
    assert second["config"]["digest"] == manifest["config"]["digest"]


@pytest.mark.parametrize(
    ("case", "target_host", "pip", "message"),
    [
        ("unreachable registry", "127.0.0.1:9", "birdnet", "is unreachable"),
        (
            "unresolvable requirement",
            None,
            "no-such-package-xyz",
            "pip install failed (exit code 1)",
        ),
    ],
)
def test_bad_input_fails_with_a_message_a_user_can_act_on(
    oci_registry: OciRegistry,
    tmp_path: Path,
    case: str,
    target_host: str | None,
    pip: str,
    message: str,
) -> None:
    base = push_base_image(oci_registry)
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    host = target_host or oci_registry.host
    done = subprocess.run(
        [
            sys.executable,
            str(ENVBUILD),
            "--base",
            base if target_host is None else f"{host}/base:1",
            "--target",
            f"{host}/envs:x",
            "--pip",
            pip,
            "--pip-arg=--no-index",
            f"--pip-arg=--find-links={wheels}",
            "--prefix",
            str(tmp_path / "prefix"),
            "--termination-log",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "TORCHYARD_INSECURE_REGISTRIES": f"{host}," + oci_registry.host,
        },
    )
    assert done.returncode == 1
    error = json.loads((tmp_path / "t.json").read_text())["error"]
    assert message in error, error


def test_credentials_from_a_push_secret_and_wrong_ones(tmp_path: Path) -> None:
    reg = OciRegistry(htpasswd=("builder", "s3cret")).start()
    try:
        auth = {"auths": {reg.host: {"username": "builder", "password": "s3cret"}}}
        client = Registry(reg.host, auth)
        assert client.manifest_digest("base", "1") is None  # authenticated, nothing there
        wrong = Registry(
            reg.host, {"auths": {reg.host: {"username": "builder", "password": "nope"}}}
        )
        with pytest.raises(envbuild.BuildError, match="refused the credentials"):
            wrong.manifest_digest("base", "1")
        with pytest.raises(envbuild.BuildError, match="needs credentials"):
            Registry(reg.host).manifest_digest("base", "1")
    finally:
        reg.stop()


def test_bearer_token_challenge_against_a_token_service(tmp_path: Path) -> None:
    reg = OciRegistry(token=("builder", "s3cret")).start()
    try:
        auth = {"auths": {reg.host: {"username": "builder", "password": "s3cret"}}}
        client = Registry(reg.host, auth)
        # Push a base image and read it back, every request with a scoped bearer token.
        layer = gzip.compress(b"layer", mtime=0)
        digest = "sha256:" + hashlib.sha256(layer).hexdigest()
        client.upload("team/base", digest, io.BytesIO(layer), len(layer))
        assert client.has_blob("team/base", digest)
        # A second repository mounts the blob from the first (a token for both scopes).
        assert client.mount("team/envs", digest, "team/base")
        assert client.has_blob("team/envs", digest)
        assert reg.token_server is not None and reg.token_server.issued >= 2
        wrong = Registry(
            reg.host, {"auths": {reg.host: {"username": "builder", "password": "nope"}}}
        )
        with pytest.raises(envbuild.BuildError, match="token service refused the credentials"):
            wrong.has_blob("team/base", digest)
    finally:
        reg.stop()

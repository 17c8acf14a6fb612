"""The unprivileged Environment builder, and a small OCI distribution client.

Standard library only, Python >= 3.8, one file: the build Job's Pod runs **in the base
image itself** (an init container copies this file in), so no Docker daemon and no
privileges are needed. It

1. installs the Environment's pip packages (``pip install --prefix``) or conda
   environment (with conda/mamba/micromamba from the base image) into a prefix,
   ``/opt/torchyard/env``;
2. packs that prefix as one reproducible layer: entries sorted, fixed mtimes, owners
   0:0, gzip without a timestamp, so the same files always give the same digest;
3. pushes the base image's layers (mounted across repositories when the registry is the
   same, else copied), the new layer, a config whose ``Env`` puts the prefix on
   ``PATH``/``PYTHONPATH`` and whose labels record the content hash, and the manifest,
   through the OCI distribution API (basic auth and bearer-token challenges);
4. writes ``{"image": "<repo>@sha256:..."}`` to the termination log.

    python envbuild.py --base REF --target REPO:TAG [--pip REQ ...] [--conda-file F]
                       [--env K=V ...] [--label K=V ...] [--pip-arg ARG ...]

(or ``python -m torchyard.envbuild ...`` where torchyard is installed; the build Job's init
container runs ``python -m torchyard.envbuild --install /torchyard/envbuild.py`` to copy it).
It is one module, several hundred lines, because it travels as one file into base images we
do not control: splitting it would mean copying a package into every build Pod. Its
variables' names are ``torchyard.launch.contract``'s, which ``--install`` copies beside it.

Registry credentials come from a ``kubernetes.io/dockerconfigjson`` file named by
``contract.TORCHYARD_REGISTRY_AUTH``; ``contract.TORCHYARD_INSECURE_REGISTRIES`` lists
hosts spoken to over plain HTTP. The operator uses :class:`Registry` too (does the image
exist?), and ``torchyard.planning.environments`` builds the Job around :data:`PREFIX` and
:data:`HASH_LABEL`. Tested in ``tests/unit/envbuild/`` and
``tests/integration/test_envbuild.py`` (a real registry), and on the real node in
``tests/node/test_environments_on_node.py``.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from types import ModuleType
from typing import IO, Any

CONTRACT_COPY = "torchyard_launch_contract.py"  # beside this file in a build Pod


def _contract() -> ModuleType:
    """The launch contract: its copy beside this file (a build Pod), else the package's."""
    copy = os.path.join(os.path.dirname(os.path.abspath(__file__)), CONTRACT_COPY)
    if not os.path.exists(copy):
        from torchyard.launch import contract

        return contract
    spec = importlib.util.spec_from_file_location("torchyard_launch_contract", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


names = _contract()

PREFIX = "/opt/torchyard/env"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)
FIXED_TIME = "1970-01-01T00:00:00Z"
HASH_LABEL = "dev.torchyard.environment.hash"
CHUNK = 1 << 20


class BuildError(Exception):
    """The build cannot go on; the message says what the user can do about it."""


# -- image references -----------------------------------------------------------------------


def parse_reference(ref: str) -> tuple[str, str, str]:
    """``host/repo:tag`` or ``repo@sha256:..`` -> (registry host, repository, tag or digest).

    Docker Hub short names (``python:3.11``) become ``registry-1.docker.io/library/python``.
    """
    name, digest = [*ref.split("@", 1), ""][:2]
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        host, repo = name.split("/", 1)
    else:
        host, repo = "registry-1.docker.io", name
        if "/" not in repo:
            repo = "library/" + repo
    if host == "docker.io":
        host = "registry-1.docker.io"
    return host, repo, digest or tag or "latest"


# -- the registry client --------------------------------------------------------------------


class Registry:
    """One registry host, spoken to with the OCI distribution API."""

    def __init__(
        self,
        host: str,
        auth: dict[str, Any] | None = None,
        insecure: bool | None = None,
        timeout: float = 30,
    ) -> None:
        self.host = host
        if insecure is None:
            insecure = host in os.environ.get(names.TORCHYARD_INSECURE_REGISTRIES, "").split(",")
        self.base = ("http://" if insecure else "https://") + host
        self.timeout = timeout
        self._basic = _basic_credentials(auth or {}, host)
        self._tokens: dict[str, str] = {}

    # transport

    def _request(
        self,
        method: str,
        url: str,
        *,
        scope: str,
        data: Any = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> Any:
        if not url.startswith("http"):
            url = self.base + url
        for attempt in range(2):
            req = urllib.request.Request(url, data=data, method=method)
            for k, v in (headers or {}).items():
                req.add_header(k, v)
            token = self._tokens.get(scope)
            if token:
                req.add_header("Authorization", "Bearer " + token)
            elif self._basic:
                req.add_header("Authorization", "Basic " + self._basic)
            try:
                resp = urllib.request.urlopen(req, timeout=self.timeout)
            except urllib.error.HTTPError as err:
                if err.code == 401 and attempt == 0:
                    self._authenticate(err.headers.get("WWW-Authenticate", ""), scope)
                    if hasattr(data, "seek"):
                        data.seek(0)
                    continue
                if err.code in ok:
                    return err
                body = err.read().decode("utf-8", "replace")[:500]
                if err.code == 401:
                    raise BuildError(
                        f"registry {self.host} refused the credentials ({method} {url}): {body}"
                    ) from None
                if err.code == 403:
                    raise BuildError(
                        f"registry {self.host} denied {method} {url}: {body}"
                    ) from None
                raise _HTTPStatus(err.code, f"{method} {url}: {err.code} {body}") from None
            except (urllib.error.URLError, OSError) as err:
                reason = getattr(err, "reason", err)
                raise BuildError(
                    f"registry {self.host} is unreachable ({reason}); check "
                    "registry.repository and the network policy"
                ) from None
            if resp.status not in ok:
                raise _HTTPStatus(resp.status, f"{method} {url}: unexpected {resp.status}")
            return resp
        raise BuildError(f"registry {self.host} keeps asking for credentials")

    def _authenticate(self, challenge: str, scope: str) -> None:
        if not challenge.lower().startswith("bearer"):
            if not self._basic:
                raise BuildError(
                    f"registry {self.host} needs credentials: give the "
                    "Environment a registry.pushSecret"
                )
            return
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = {"service": params.get("service", "")}
        if scope:
            query["scope"] = scope
        url = params["realm"] + "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url)
        if self._basic:
            req.add_header("Authorization", "Basic " + self._basic)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise BuildError(
                f"registry {self.host}: token service refused the credentials ({err.code})"
            ) from None
        except (urllib.error.URLError, OSError) as err:
            raise BuildError(
                f"registry {self.host}: token service unreachable ({getattr(err, 'reason', err)})"
            ) from None
        self._tokens[scope] = data.get("token") or data.get("access_token") or ""

    # reading

    def manifest(self, repo: str, ref: str) -> tuple[dict[str, Any], str, str]:
        """(manifest, media type, digest); an index is resolved to this platform's image."""
        resp = self._request(
            "GET",
            f"/v2/{repo}/manifests/{ref}",
            scope=_pull(repo),
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        body = resp.read()
        media = resp.headers.get("Content-Type", "").split(";")[0]
        digest = resp.headers.get("Docker-Content-Digest") or _digest(body)
        doc = json.loads(body)
        media = doc.get("mediaType") or media
        if media in (OCI_INDEX, DOCKER_LIST):
            arch = _platform_arch()
            for entry in doc.get("manifests", []):
                plat = entry.get("platform", {})
                if plat.get("os") == "linux" and plat.get("architecture") == arch:
                    return self.manifest(repo, entry["digest"])
            raise BuildError(f"{repo}:{ref} has no linux/{arch} image")
        return doc, media, digest

    def manifest_digest(self, repo: str, ref: str) -> str | None:
        """The digest of repo:ref, or None when it does not exist (HEAD)."""
        try:
            resp = self._request(
                "HEAD",
                f"/v2/{repo}/manifests/{ref}",
                scope=_pull(repo),
                headers={"Accept": ", ".join(MANIFEST_TYPES)},
                ok=(200, 404),
            )
        except _HTTPStatus as err:
            raise BuildError(f"registry {self.host}: {err}") from None
        if resp.status == 404:
            return None
        digest: str | None = resp.headers.get("Docker-Content-Digest")
        return digest

    def blob(self, repo: str, digest: str) -> IO[bytes]:
        resp: IO[bytes] = self._request("GET", f"/v2/{repo}/blobs/{digest}", scope=_pull(repo))
        return resp

    def has_blob(self, repo: str, digest: str) -> bool:
        resp = self._request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=_pull(repo), ok=(200, 404))
        return bool(resp.status == 200)

    # writing

    def mount(self, repo: str, digest: str, source_repo: str) -> bool:
        """Cross-repository mount; False when the registry wants an upload instead."""
        query = urllib.parse.urlencode({"mount": digest, "from": source_repo})
        resp = self._request(
            "POST",
            f"/v2/{repo}/blobs/uploads/?{query}",
            scope=_push(repo) + " " + _pull(source_repo),
            data=b"",
            ok=(201, 202),
        )
        return bool(resp.status == 201)

    def upload(self, repo: str, digest: str, data: IO[bytes], size: int) -> None:
        if self.has_blob(repo, digest):
            return
        start = self._request(
            "POST", f"/v2/{repo}/blobs/uploads/", scope=_push(repo), data=b"", ok=(202,)
        )
        location = start.headers["Location"]
        if location.startswith("/"):
            location = self.base + location
        sep = "&" if "?" in location else "?"
        self._request(
            "PUT",
            f"{location}{sep}digest={urllib.parse.quote(digest)}",
            scope=_push(repo),
            data=data,
            ok=(201,),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )

    def put_manifest(self, repo: str, ref: str, body: bytes, media: str) -> str:
        resp = self._request(
            "PUT",
            f"/v2/{repo}/manifests/{ref}",
            scope=_push(repo),
            data=body,
            ok=(201,),
            headers={"Content-Type": media},
        )
        digest: str = resp.headers.get("Docker-Content-Digest") or _digest(body)
        return digest


class _HTTPStatus(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _pull(repo: str) -> str:
    return f"repository:{repo}:pull"


def _push(repo: str) -> str:
    return f"repository:{repo}:pull,push"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _platform_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _basic_credentials(auth: dict[str, Any], host: str) -> str:
    """The base64 user:password for ``host`` from a dockerconfigjson document."""
    entries = auth.get("auths", {})
    for key in (host, "https://" + host, "http://" + host, host.replace("registry-1.", "")):
        entry = entries.get(key)
        if entry:
            if entry.get("auth"):
                return str(entry["auth"])
            raw = f"{entry.get('username', '')}:{entry.get('password', '')}"
            return base64.b64encode(raw.encode()).decode()
    return ""


def load_auth(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as err:
        raise BuildError(f"cannot read registry credentials {path}: {err}") from None
    return data


# -- the layer ------------------------------------------------------------------------------


def pack_layer(root: str, prefix: str, out: IO[bytes]) -> tuple[str, str, int]:
    """Write ``root`` as a gzipped tar layer at ``prefix``; (digest, diff_id, size).

    Reproducible: sorted entries, mtime 0, uid/gid 0, no user names, gzip mtime 0.
    """
    diff = hashlib.sha256()
    digest = hashlib.sha256()

    class _Tee(io.RawIOBase):
        def __init__(self) -> None:
            self.size = 0

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            data = bytes(b)
            out.write(data)
            digest.update(data)
            self.size += len(data)
            return len(data)

    sink = _Tee()
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=6)

    class _DiffTee(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            data = bytes(b)
            diff.update(data)
            gz.write(data)
            return len(data)

    tar = tarfile.open(fileobj=_DiffTee(), mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115
    parts = prefix.strip("/").split("/")
    for i in range(1, len(parts)):
        _add_dir(tar, "/".join(parts[:i]))
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            entries.append(os.path.join(dirpath, name))
    _add_dir(tar, prefix.strip("/"))
    for path in sorted(entries):
        arc = prefix.strip("/") + "/" + os.path.relpath(path, root)
        info = tar.gettarinfo(path, arcname=arc)
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if info.isfile():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            tar.addfile(info)
    tar.close()
    gz.close()
    return "sha256:" + digest.hexdigest(), "sha256:" + diff.hexdigest(), sink.size


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    tar.addfile(info)


# -- installing -----------------------------------------------------------------------------


def install(
    prefix: str,
    pip: list[str],
    conda_file: str | None,
    pip_args: list[str],
    path: str | None = None,
) -> None:
    """Install into ``prefix``; ``path`` is where to look for conda tools (default PATH)."""
    os.makedirs(prefix, exist_ok=True)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.setdefault("HOME", tempfile.gettempdir())
    if conda_file:
        tool = next(
            (t for t in ("micromamba", "mamba", "conda") if shutil.which(t, path=path)), None
        )
        if tool is None:
            raise BuildError(
                "the Environment has a conda specification but the base image "
                "has no conda, mamba or micromamba: use a base image with one "
                "(e.g. mambaorg/micromamba) or list the packages under pip"
            )
        cmd = [
            tool,
            "env",
            "create",
            "--yes" if tool == "micromamba" else "--quiet",
            "-p",
            prefix,
            "-f",
            conda_file,
        ]
        _run(cmd, env, "conda environment")
    if pip:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-compile",
            "--no-cache-dir",
            "--prefix",
            prefix,
            "--no-warn-script-location",
            *pip_args,
            *pip,
        ]
        _run(cmd, env, "pip install")


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    print("[envbuild] " + " ".join(cmd), flush=True)
    try:
        done = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as err:
        raise BuildError(f"{what} could not start: {err}") from None
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-15:])
        raise BuildError(f"{what} failed (exit code {done.returncode}):\n{tail}")


def site_packages(prefix: str) -> str | None:
    """Where pip put the packages under ``prefix``, for ``PYTHONPATH``.

    ``lib/pythonX.Y/site-packages`` for upstream Python (``python:3.11-slim``); Debian's
    and Ubuntu's own Python installs ``--prefix P`` into ``P/local/lib/pythonX.Y/dist-packages``
    (its ``posix_local`` scheme), so both names count. The first one found, sorted.
    """
    for dirpath, dirnames, _ in os.walk(prefix):
        if os.path.basename(dirpath) in ("site-packages", "dist-packages"):
            return dirpath
        dirnames.sort()
    return None


def script_dirs(prefix: str) -> list[str]:
    """Where console scripts go: ``P/bin``, and ``P/local/bin`` under Debian's Python."""
    found = [os.path.join(prefix, "bin")]
    local = os.path.join(prefix, "local", "bin")
    if os.path.isdir(local):
        found.append(local)
    return found


# -- the image ------------------------------------------------------------------------------


def new_config(
    base: dict[str, Any],
    diff_id: str,
    prefix: str,
    pythonpath: str | None,
    env: dict[str, str],
    labels: dict[str, str],
    bin_dirs: list[str] | None = None,
) -> dict[str, Any]:
    config = json.loads(json.dumps(base))
    inner = config.setdefault("config", {})
    variables = dict(e.split("=", 1) for e in inner.get("Env") or [] if "=" in e)
    path = variables.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    variables["PATH"] = ":".join([*(bin_dirs or [f"{prefix}/bin"]), path])
    if pythonpath:
        old = variables.get("PYTHONPATH")
        variables["PYTHONPATH"] = pythonpath + (":" + old if old else "")
    variables.update(env)
    inner["Env"] = [f"{k}={v}" for k, v in variables.items()]
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(diff_id)
    config.setdefault("history", []).append(
        {"created": FIXED_TIME, "created_by": "torchyard envbuild: " + prefix}
    )
    config["created"] = FIXED_TIME
    return dict(config)


def new_manifest(
    base: dict[str, Any],
    config_digest: str,
    config_size: int,
    layer: dict[str, Any],
    labels: dict[str, str],
) -> dict[str, Any]:
    """The new image's OCI manifest: the base image's layers, then ``layer``.

    Each base layer keeps its own media type: an uncompressed (``...tar``) or zstd layer
    declared ``tar+gzip`` is one that the container runtime cannot unpack.
    """
    layers = [
        {"mediaType": e.get("mediaType") or OCI_LAYER, "digest": e["digest"], "size": e["size"]}
        for e in base["layers"]
    ]
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [*layers, layer],
        "annotations": labels,
    }


def build(
    base_ref: str,
    target_ref: str,
    pip: list[str],
    conda_file: str | None,
    env: dict[str, str],
    labels: dict[str, str],
    pip_args: list[str],
    prefix: str = PREFIX,
    auth: dict[str, Any] | None = None,
) -> str:
    """Build and push; returns ``<registry>/<repo>@sha256:...``."""
    t_host, t_repo, t_tag = parse_reference(target_ref)
    b_host, b_repo, b_ref = parse_reference(base_ref)
    target = Registry(t_host, auth)
    base_reg = target if b_host == t_host else Registry(b_host, auth)
    # the user too: a build that cannot write somewhere is easier to explain with it
    print(f"[envbuild] base {base_ref}, target {target_ref}, uid {os.getuid()}", flush=True)
    base_manifest, _, _ = base_reg.manifest(b_repo, b_ref)
    base_config = json.loads(base_reg.blob(b_repo, base_manifest["config"]["digest"]).read())

    install(prefix, pip, conda_file, pip_args)
    with tempfile.TemporaryFile() as layer:
        digest, diff_id, size = pack_layer(prefix, prefix, layer)
        print(f"[envbuild] layer {digest} ({size} bytes)", flush=True)
        for entry in base_manifest["layers"]:
            if target.has_blob(t_repo, entry["digest"]):
                continue
            if b_host == t_host and target.mount(t_repo, entry["digest"], b_repo):
                continue
            with tempfile.TemporaryFile() as copy:
                shutil.copyfileobj(base_reg.blob(b_repo, entry["digest"]), copy, CHUNK)
                copy.seek(0)
                target.upload(t_repo, entry["digest"], copy, entry["size"])
        layer.seek(0)
        target.upload(t_repo, digest, layer, size)
    config = new_config(
        base_config, diff_id, prefix, site_packages(prefix), env, labels, script_dirs(prefix)
    )
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = _digest(config_bytes)
    target.upload(t_repo, config_digest, io.BytesIO(config_bytes), len(config_bytes))
    layer_entry = {"mediaType": OCI_LAYER, "digest": digest, "size": size}
    manifest = new_manifest(base_manifest, config_digest, len(config_bytes), layer_entry, labels)
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    pushed = target.put_manifest(t_repo, t_tag, body, OCI_MANIFEST)
    host = "docker.io" if t_host == "registry-1.docker.io" else t_host
    return f"{host}/{t_repo}@{pushed}"


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise BuildError(f"{what} must be KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--install":  # the init container: this file and the contract
        folder = os.path.dirname(args[1]) or "."
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(os.path.abspath(__file__), args[1])
        shutil.copyfile(os.path.abspath(names.__file__ or ""), os.path.join(folder, CONTRACT_COPY))
        return 0
    parser = argparse.ArgumentParser(prog="envbuild", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="base image reference")
    parser.add_argument("--target", required=True, help="repository:tag to push")
    parser.add_argument("--pip", action="append", default=[], help="a pip requirement")
    parser.add_argument(
        "--pip-arg",
        action="append",
        default=[],
        help="an extra pip argument (e.g. --index-url=...)",
    )
    parser.add_argument("--conda-file", help="a conda environment.yml")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE baked in")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE label")
    parser.add_argument("--prefix", default=PREFIX)
    parser.add_argument(
        "--termination-log",
        default=os.environ.get(names.TORCHYARD_TERMINATION_LOG, names.TERMINATION_LOG),
    )
    opts = parser.parse_args(args)
    try:
        image = build(
            opts.base,
            opts.target,
            opts.pip,
            opts.conda_file,
            _pairs(opts.env, "--env"),
            _pairs(opts.label, "--label"),
            opts.pip_arg,
            prefix=opts.prefix,
            auth=load_auth(os.environ.get(names.TORCHYARD_REGISTRY_AUTH)),
        )
    except BuildError as err:
        print(f"[envbuild] error: {err}", file=sys.stderr, flush=True)
        _write(opts.termination_log, json.dumps({"error": str(err)[-3500:]}))
        return 1
    print(f"[envbuild] pushed {image}", flush=True)
    _write(opts.termination_log, json.dumps({"image": image}))
    return 0


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())

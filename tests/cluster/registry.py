"""A real OCI registry (CNCF distribution) on loopback, for Environment builds.

Built from Go modules like the rest of the harness (``tests/cluster/go/registry``);
``OciRegistry`` runs it with filesystem storage in a temporary folder, plain HTTP on
127.0.0.1, and tells the builder and the operator so via TORCHYARD_INSECURE_REGISTRIES.
With ``address=`` (this machine's non-loopback address) it serves where the real node's
Pods and containerd reach it too (tests/node/test_environments_on_node.py);
``anonymous_pull=True`` lets anyone pull while pushing needs the credentials, as a
public registry does. ``push_archive`` pushes a locally made image archive
(``tests/cluster/images.py``) into it with the builder's own client.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.cluster import binaries
from tests.cluster.harness import free_port
from torchyard import envbuild


class TokenServer:
    """A Docker-style token service on loopback: Basic credentials in, signed JWT out.

    The registry trusts it through ``rootcertbundle``; tokens carry the certificate in
    ``x5c`` and grant exactly the scopes asked for, to the one user it knows.
    """

    def __init__(
        self,
        workdir: Path,
        user: str,
        password: str,
        address: str = "127.0.0.1",
        anonymous_pull: bool = False,
    ) -> None:
        self.workdir, self.user, self.password = workdir, user, password
        self.anonymous_pull = anonymous_pull
        self.issued = 0
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                "token.key",
                "-out",
                "token.crt",
                "-subj",
                "/CN=torchyard-token",
            ],
            cwd=workdir,
            check=True,
            capture_output=True,
        )
        der = subprocess.run(
            ["openssl", "x509", "-in", "token.crt", "-outform", "DER"],
            cwd=workdir,
            check=True,
            capture_output=True,
        ).stdout
        self.x5c = base64.b64encode(der).decode()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                expected = base64.b64encode(f"{server.user}:{server.password}".encode())
                given = self.headers.get("Authorization", "")
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                scopes = " ".join(query.get("scope", [])).split()
                if given != "Basic " + expected.decode():
                    if given or not server.anonymous_pull:
                        self.send_response(401)
                        self.end_headers()
                        return
                    scopes = [_pull_only(s) for s in scopes]  # anonymous: pull, nothing more
                body = json.dumps({"token": server.token(query["service"][0], scopes)})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.realm = f"http://{address}:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, service: str, scopes: list[str]) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        now = int(time.time())
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append(
                {"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]}
            )
        header = {"alg": "RS256", "typ": "JWT", "x5c": [self.x5c]}
        claims = {
            "iss": "torchyard-test",
            "sub": self.user,
            "aud": service,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": str(now) + str(self.issued),
            "access": access,
        }
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", "token.key"],
            input=signing_input.encode(),
            cwd=self.workdir,
            check=True,
            capture_output=True,
        ).stdout
        self.issued += 1
        return f"{signing_input}.{b64(signature)}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _pull_only(scope: str) -> str:
    """``repository:NAME:pull,push`` -> ``repository:NAME:pull`` (no actions if no pull)."""
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    kept = [a for a in actions.split(",") if a == "pull"]
    return f"{kind}:{name}:{','.join(kept)}"


class OciRegistry:
    def __init__(
        self,
        htpasswd: tuple[str, str] | None = None,
        token: tuple[str, str] | None = None,
        address: str = "127.0.0.1",
        anonymous_pull: bool = False,
    ) -> None:
        if anonymous_pull and token is None:
            raise ValueError("anonymous_pull needs token=(user, password): the push credentials")
        self.htpasswd = htpasswd
        self.token = token
        self.anonymous_pull = anonymous_pull
        self.address = address
        self.token_server: TokenServer | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="torchyard-registry-"))
        self.port = free_port()
        self.host = f"{address}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OciRegistry:
        tool = binaries.TOOLS["registry"]
        binaries.build(tool)
        config = self.workdir / "config.yml"
        text = (
            "version: 0.1\n"
            "log: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.workdir / 'data'}}}}}\n"
            f"http: {{addr: {self.host}}}\n"
        )
        if self.htpasswd is not None:
            import bcrypt

            user, password = self.htpasswd
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            (self.workdir / "htpasswd").write_text(f"{user}:{hashed}\n")
            path = self.workdir / "htpasswd"
            text += f"auth: {{htpasswd: {{realm: torchyard-test, path: {path}}}}}\n"
        if self.token is not None:
            self.token_server = TokenServer(
                self.workdir, *self.token, address=self.address, anonymous_pull=self.anonymous_pull
            )
            text += (
                "auth: {token: {"
                f"realm: '{self.token_server.realm}', service: torchyard-test-registry, "
                f"issuer: torchyard-test, rootcertbundle: {self.workdir / 'token.crt'}}}}}\n"
            )
        config.write_text(text)
        log = open(self.workdir / "registry.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(tool.path("registry")), "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the registry did not start:\n"
                    + (self.workdir / "registry.log").read_text()[-2000:]
                )
            time.sleep(0.1)
        hosts = [h for h in os.environ.get("TORCHYARD_INSECURE_REGISTRIES", "").split(",") if h]
        os.environ["TORCHYARD_INSECURE_REGISTRIES"] = ",".join([*hosts, self.host])
        return self

    def _up(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as err:
            return err.code == 401  # up, and asking for credentials
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.token_server is not None:
            self.token_server.stop()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def push_archive(
    registry: OciRegistry, archive: Path, repo: str, tag: str, auth: dict[str, Any] | None = None
) -> str:
    """Push the one image of an OCI image-layout archive (as ``tests/cluster/images.py``
    caches them) to ``registry`` as ``repo:tag`` with the builder's own client; blobs
    stream from the archive. Returns ``host/repo:tag``."""
    client = envbuild.Registry(registry.host, auth, insecure=True, timeout=120)
    push_archive_with(client, archive, repo, tag)
    return f"{registry.host}/{repo}:{tag}"


def push_archive_with(client: envbuild.Registry, archive: Path, repo: str, tag: str) -> str:
    """Push the one image of ``archive`` with ``client`` (any registry: the release pushes
    to its own this way) as ``repo:tag``. Returns the manifest's digest, unchanged by the
    push (the manifest's bytes are the archive's)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> tuple[IO[bytes], int]:
            member = tar.getmember("blobs/sha256/" + digest.removeprefix("sha256:"))
            data = tar.extractfile(member)
            if data is None:
                raise ValueError(f"{archive}: blob {digest} is not a file")
            return data, member.size

        index = json.load(_blob_file(tar, "index.json"))
        entries = index.get("manifests", [])
        if len(entries) != 1:
            raise ValueError(f"{archive}: expected one image in index.json, found {len(entries)}")
        data, _ = blob(entries[0]["digest"])
        body = data.read()
        manifest = json.loads(body)
        for entry in [manifest["config"], *manifest["layers"]]:
            data, size = blob(entry["digest"])
            client.upload(repo, entry["digest"], data, size)
        client.put_manifest(repo, tag, body, manifest.get("mediaType") or envbuild.OCI_MANIFEST)
    return str(entries[0]["digest"])


def _blob_file(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    data = tar.extractfile(name)
    if data is None:
        raise ValueError(f"{tar.name!r}: {name} is not a file")
    return data

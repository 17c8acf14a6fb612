"""A real OCI registry (CNCF distribution) on loopback, for Environment builds.

Built from Go modules like the rest of the harness (``tests/cluster/go/registry``);
``OciRegistry`` runs it with filesystem storage in a temporary folder, plain HTTP on
127.0.0.1, and tells the builder and the operator so via TORCHYARD_INSECURE_REGISTRIES.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.cluster import binaries
from tests.cluster.harness import free_port


class TokenServer:
    """A Docker-style token service on loopback: Basic credentials in, signed JWT out.

    The registry trusts it through ``rootcertbundle``; tokens carry the certificate in
    ``x5c`` and grant exactly the scopes asked for, to the one user it knows.
    """

    def __init__(self, workdir: Path, user: str, password: str) -> None:
        self.workdir, self.user, self.password = workdir, user, password
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
                if self.headers.get("Authorization", "") != "Basic " + expected.decode():
                    self.send_response(401)
                    self.end_headers()
                    return
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                scopes = " ".join(query.get("scope", [])).split()
                body = json.dumps({"token": server.token(query["service"][0], scopes)})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, service: str, scopes: list[str]) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        now = int(time.time())
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
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


class OciRegistry:
    def __init__(
        self, htpasswd: tuple[str, str] | None = None, token: tuple[str, str] | None = None
    ) -> None:
        self.htpasswd = htpasswd
        self.token = token
        self.token_server: TokenServer | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="torchyard-registry-"))
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
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
            self.token_server = TokenServer(self.workdir, *self.token)
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

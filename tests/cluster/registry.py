"""A real OCI registry (CNCF distribution) on loopback, for Environment builds.

Built from Go modules like the rest of the harness (``tests/cluster/go/registry``);
``OciRegistry`` runs it with filesystem storage in a temporary folder, plain HTTP on
127.0.0.1, and tells the builder and the operator so via TORCHYARD_INSECURE_REGISTRIES.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.cluster import binaries
from tests.cluster.harness import free_port


class OciRegistry:
    def __init__(self, htpasswd: tuple[str, str] | None = None) -> None:
        self.htpasswd = htpasswd
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
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)

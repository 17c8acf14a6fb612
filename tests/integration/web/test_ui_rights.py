"""``torchyard ui`` as the caller, on the real control plane: started with a kubeconfig of
a ServiceAccount, it prints its URL; the view reads and changes only what that identity
may. A viewer's Suspend button gets the apiserver's 403, shown on the page, and nothing
changes; an editor's suspends the run; nothing of a namespace the identity cannot read
shows in any page or API answer."""

from __future__ import annotations

import http.cookiejar
import os
import re
import select
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.chart import service_account_kubeconfig
from tests.cluster.harness import Cluster
from tests.integration.web.browser import READS, account
from torchyard import k8s

RUN_READER = READS


def identity(cluster: Cluster, namespace: str, name: str, verbs: list[str], path: Path) -> Path:
    """A ServiceAccount with ``verbs`` on TrainingRuns (``browser.account``), and a
    kubeconfig that is it."""
    account(namespace, name, verbs)
    return service_account_kubeconfig(cluster, namespace, name, path)


class Ui:
    """``torchyard ui`` in a process of its own; ``url`` is what it printed; a browser's
    cookies (the pages' tokens are bound to them)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchyard",
                "ui",
                "--kubeconfig",
                str(kubeconfig),
                "-n",
                namespace,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "TORCHYARD_REGISTRY_URL"},
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline() if ready else ""
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        assert found, f"torchyard ui said: {line!r}"
        self.url = found[1].rstrip("/")
        self.browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.browser.open(self.url + path, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def post(self, path: str, token: str) -> tuple[int, str]:
        data = f"token={token}".encode()
        req = urllib.request.Request(
            self.url + path, data=data, method="POST", headers={"Origin": self.url}
        )
        try:
            with self.browser.open(req, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace(f"t-web-other-{os.urandom(2).hex()}")
    yield name
    cluster.delete_namespace(name)


def page_token(text: str) -> str:
    found = re.search(r'name="torchyard-token" content="([^"]+)"', text)
    assert found
    return found[1]


def suspended(namespace: str, name: str) -> Any:
    return (k8s.get(k8s.TRAININGRUNS, namespace, name).get("spec") or {}).get("suspend")


def test_the_view_acts_with_the_callers_rights_only(
    cluster: Cluster, namespace: str, other_namespace: str, stopped_operator: None, tmp_path: Path
) -> None:
    k8s.create(TrainingRunBuilder("mine", namespace).obj())
    secret = "secret-of-the-other-team"
    k8s.create(TrainingRunBuilder(secret, other_namespace).obj())
    viewer = Ui(identity(cluster, namespace, "viewer", RUN_READER, tmp_path / "viewer"), namespace)
    try:
        status, text = viewer.get(f"/ns/{namespace}/runs/mine")
        assert status == 200 and "Suspend" in text
        status, text = viewer.post(f"/ns/{namespace}/runs/mine/suspend", page_token(text))
        assert status == 403 and "forbidden" in text and 'role="alert"' in text
        assert not suspended(namespace, "mine")
        for path in (
            f"/ns/{other_namespace}/runs",
            f"/ns/{other_namespace}/runs/{secret}",
            f"/api/ns/{other_namespace}/runs",
            f"/api/ns/{other_namespace}/runs/{secret}",
            f"/api/ns/{other_namespace}/runs/{secret}/log?node=0",
            f"/ns/{other_namespace}/sweeps",
            f"/ns/{other_namespace}/queue",
        ):
            status, text = viewer.get(path)
            assert status == 403, (path, status, text[:300])
            if secret not in path:  # (a name the caller asked for is said back, nothing else)
                assert secret not in text
            assert "forbidden" in text
        status, text = viewer.get(f"/ns/{namespace}/runs")
        assert status == 200 and "mine" in text and secret not in text
    finally:
        viewer.stop()
    editor_verbs = [*RUN_READER, "patch"]
    editor = Ui(
        identity(cluster, namespace, "editor", editor_verbs, tmp_path / "editor"), namespace
    )
    try:
        status, text = editor.get(f"/ns/{namespace}/runs/mine")
        status, text = editor.post(f"/ns/{namespace}/runs/mine/suspend", page_token(text))
        assert status == 200 and "Resume" in text  # (after the 303 back to the run's page)
        assert suspended(namespace, "mine") is True
    finally:
        editor.stop()


def test_ui_help_says_what_it_serves() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "torchyard", "ui", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "127.0.0.1" in out and "--port" in out and "RBAC" in out

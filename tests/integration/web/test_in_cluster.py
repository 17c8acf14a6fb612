"""The web view as the chart deploys it (``torchyard ui --in-cluster``), on the real
control plane: callers bring a Kubernetes token (TokenReview), every read is authorized
for that identity (SubjectAccessReview) before the server reads it; a token of namespace
A sees nothing of namespace B in any page or API call, and the server keeps no token."""

from __future__ import annotations

import http.cookiejar
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder, environment, model_version
from tests.cluster.harness import Cluster
from tests.integration.web.browser import CHROMIUM, FLAGS, READS, SHOTS, Served, account, playwright
from torchyard import k8s
from torchyard.web import access, app, source

SECRET = "b-secret-run"


def reader(namespace: str, name: str) -> str:
    """A ServiceAccount that may read the namespace's runs (and what their pages show);
    its token (TokenRequest, the apiserver's audience)."""
    account(namespace, name, READS)
    return k8s.request_token(namespace, name, [], seconds=3600)


@pytest.fixture
def team_b(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace(f"t-web-b-{os.urandom(2).hex()}")
    yield name
    cluster.delete_namespace(name)


@pytest.fixture
def server(namespace: str, team_b: str) -> Iterator[str]:
    for ns, run in ((namespace, "a-run"), (team_b, SECRET)):
        k8s.create(TrainingRunBuilder(run, ns).obj())
        k8s.create(SweepBuilder(f"{run}-sweep", ns).obj())
        k8s.create(environment(f"{run}-env", ns, image="ghcr.io/acme/pytorch:2.15"))
        k8s.create(model_version(f"{run}-model-1", ns, f"{run}-model", 1))
    served = Served(
        app.make_app(
            source.LiveSource(), namespace="default", reviews=access.kubernetes_reviews(ttl=1.0)
        )
    )
    yield served.url
    served.stop()


class Browser:
    """urllib with a cookie jar: what a browser sends, no redirects followed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect()
        )

    def call(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, dict[str, str]]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(
                urllib.request.Request(self.base + path, data=data, headers=headers or {}),
                timeout=30,
            ) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(), dict(err.headers)

    def token(self, path: str) -> str:
        """The page token of ``path`` as this browser gets it."""
        _, page, _ = self.call(path)
        found = re.search(r'name="torchyard-token" content="([^"]+)"', page)
        assert found, page[:300]
        return found[1]

    def login(
        self, token: str, headers: dict[str, str] | None = None
    ) -> tuple[int, str, dict[str, str]]:
        return self.call("/login", {"token": self.token("/login"), "k8s_token": token}, headers)


def pages_of(ns: str, run: str) -> list[str]:
    return [
        f"/ns/{ns}/runs",
        f"/ns/{ns}/runs/{run}",
        f"/ns/{ns}/sweeps",
        f"/ns/{ns}/sweeps/{run}-sweep",
        f"/ns/{ns}/models",
        f"/ns/{ns}/environments",
        f"/ns/{ns}/environments/{run}-env",
        f"/ns/{ns}/queue",
        f"/api/ns/{ns}/runs",
        f"/api/ns/{ns}/runs/{run}",
        f"/api/ns/{ns}/runs/{run}/log?node=0",
        f"/api/ns/{ns}/runs/{run}/metrics?name=loss",
    ]


def test_a_token_of_namespace_a_sees_nothing_of_namespace_b(
    server: str, namespace: str, team_b: str
) -> None:
    alice = Browser(server)
    status, _, headers = alice.call(f"/ns/{namespace}/runs")
    assert status == 303 and headers["Location"] == "/login"
    assert alice.call(f"/api/ns/{namespace}/runs")[0] == 401
    assert alice.login("not-a-token")[0] == 401
    status, _, headers = alice.login(reader(namespace, "alice"))
    assert status == 303 and headers["Location"] == f"/ns/{namespace}/runs"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    for path in pages_of(namespace, "a-run")[:8]:
        status, text, _ = alice.call(path)
        assert status == 200, (path, text[:300])
        assert SECRET not in text
    for path in pages_of(team_b, SECRET):
        status, text, _ = alice.call(path)
        assert status == 403, (path, status, text[:300])
        assert "may not" in text
        said = text.replace(path, "")
        assert SECRET not in said or f"/{SECRET}" in path  # (only a name the caller asked for)
    token = alice.token(f"/ns/{namespace}/runs/a-run")
    status, text, _ = alice.call(f"/ns/{namespace}/runs/a-run/suspend", {"token": token})
    assert status == 403 and "may not patch trainingruns" in text
    assert not (k8s.get(k8s.TRAININGRUNS, namespace, "a-run")["spec"].get("suspend"))


def test_a_post_from_another_origin_or_with_another_browsers_token_changes_nothing(
    server: str, namespace: str
) -> None:
    """Over HTTP, as a page of another site, another port or another browser would send
    it: every button and the sign-in refused (403), nothing changed."""
    account(namespace, "erin", [*READS, "patch"])
    erin = k8s.request_token(namespace, "erin", [], seconds=3600)
    mallory = reader(namespace, "mallory")
    victim, attacker = Browser(server), Browser(server)
    status, _, _ = victim.login(erin)
    assert status == 303
    suspend = f"/ns/{namespace}/runs/a-run/suspend"
    cancel = f"/ns/{namespace}/sweeps/a-run-sweep/cancel"
    own = victim.token(f"/ns/{namespace}/runs/a-run")
    anonymous = attacker.token("/login")  # (today's view printed every session's token here)
    port = int(server.rsplit(":", 1)[1])
    foreign = [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Referer": "http://evil.example/attack.html"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},
        {"Origin": server, "Sec-Fetch-Site": "same-site"},
        {"Origin": server, "Sec-Fetch-Site": "cross-site"},
    ]
    for path in (suspend, cancel):
        for headers in foreign:
            status, text, _ = victim.call(path, {"token": own}, headers)
            assert status == 403 and "changes nothing" in text, (path, headers, status)
        status, text, _ = victim.call(path, {"token": anonymous}, {"Origin": server})
        assert status == 403 and "wrong page token" in text, (path, status)
    assert not k8s.get(k8s.TRAININGRUNS, namespace, "a-run")["spec"].get("suspend")
    assert not k8s.get(k8s.SWEEPS, namespace, "a-run-sweep")["spec"].get("cancel")
    # a sign-in from another site: the victim stays signed in as erin
    signed_in = {c.name: c.value for c in victim.jar}[access.COOKIE]
    status, _, headers = victim.login(mallory, {"Origin": "http://evil.example"})
    assert status == 403 and "Set-Cookie" not in headers
    assert {c.name: c.value for c in victim.jar}[access.COOKIE] == signed_in == erin
    # and the victim's own button, from its own origin, works
    status, _, headers = victim.call(suspend, {"token": own}, {"Origin": server})
    assert status == 303, headers
    assert k8s.get(k8s.TRAININGRUNS, namespace, "a-run")["spec"]["suspend"] is True


def test_signing_in_with_a_token_in_a_real_browser(server: str, namespace: str) -> None:
    token = reader(namespace, "carol")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(server + f"/ns/{namespace}/runs")
        assert page.url.endswith("/login")
        page.screenshot(path=str(SHOTS / "login.png"))
        page.get_by_label("Kubernetes token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"**/ns/{namespace}/runs")
        page.get_by_text("a-run", exact=True).wait_for()
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads the token
        page.screenshot(path=str(SHOTS / "signed-in.png"))
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url("**/login")
        page.goto(server + f"/ns/{namespace}/runs")
        assert page.url.endswith("/login")  # the cookie is gone
        assert errors == []
        browser.close()

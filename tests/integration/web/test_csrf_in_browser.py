"""Pages of other origins in a real browser (Debian's Chromium driven by Playwright) try
what a forged request can try against the web view on the real control plane, each with
the token another browser got from the view (``/login`` hands one to anyone), and change
nothing: a page of another site submitting Suspend to ``torchyard ui`` (no sign-in: the
kubeconfig's rights), a page of the same host on another port submitting Suspend and
Cancel to the signed-in view (its SameSite=Strict cookies go along: same site), and a
page of another site signing the browser in as another identity (login CSRF). The
view's own Suspend button still works. A screenshot of each under build/web-screenshots/.

The other site is ``evil.test``, which Chromium resolves to 127.0.0.1
(``--host-resolver-rules``); the pages come from a small server of the test's.
"""

from __future__ import annotations

import html
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.builders import SweepBuilder, TrainingRunBuilder
from tests.integration.web.browser import (
    CHROMIUM,
    FLAGS,
    READS,
    SHOTS,
    Served,
    account,
    playwright,
    watched_page,
)
from tests.integration.web.test_in_cluster import Browser
from torchyard import k8s
from torchyard.web import access, app, source

EVIL = "evil.test"


class Attacker:
    """Pages that submit a form to the view as soon as they load, served on 127.0.0.1
    (``evil.test`` and ``localhost`` in the browser: another site, the same site)."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "no such page").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forge(self, path: str, action: str, fields: dict[str, str]) -> None:
        """A page at ``path`` that POSTs ``fields`` to ``action`` when it loads."""
        inputs = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in fields.items()
        )
        self.pages[path] = (
            f'<!doctype html><title>prize</title><form method="post" '
            f'action="{html.escape(action)}">{inputs}</form>'
            "<script>document.forms[0].submit()</script>"
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    evil = Attacker()
    yield evil
    evil.stop()


@pytest.fixture
def chromium() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=[*FLAGS, f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"]
        )
        yield browser
        browser.close()


def suspended(namespace: str, name: str) -> Any:
    return k8s.get(k8s.TRAININGRUNS, namespace, name)["spec"].get("suspend")


def forged(page: Any, errors: list[str], url: str, shot: str) -> str:
    """Open the attacker's page ``url``, wait for where its form lands; the text shown
    (the refusal's 403 is the only console line it leaves)."""
    page.goto(url)
    page.wait_for_url(lambda u: not u.startswith(url), timeout=30_000)
    page.wait_for_load_state()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / shot))
    errors[:] = [e for e in errors if "403" not in e]
    text: str = page.locator("body").inner_text()
    return text


def test_a_page_of_another_site_cannot_suspend_a_run_of_torchyard_ui(
    namespace: str, stopped_operator: None, attacker: Attacker, chromium: Any
) -> None:
    k8s.create(TrainingRunBuilder("mine", namespace).obj())
    served = Served(app.make_app(source.LiveSource(), namespace=namespace))
    view = served.url.replace("127.0.0.1", "localhost")
    try:
        leaked = Browser(served.url).token("/login")  # (today's view printed it to anyone)
        attacker.forge("/win", f"{view}/ns/{namespace}/runs/mine/suspend", {"token": leaked})
        page, errors = watched_page(chromium.new_context())
        page.goto(f"{view}/ns/{namespace}/runs/mine")  # (the victim has the view open)
        page.get_by_role("button", name="Suspend").wait_for()
        text = forged(page, errors, f"http://{EVIL}:{attacker.port}/win", "csrf-cross-site.png")
        assert "403" in text and "changes nothing" in text, text
        assert not suspended(namespace, "mine")
        # the view's own button, from its own page, does it
        page.goto(f"{view}/ns/{namespace}/runs/mine")
        page.get_by_role("button", name="Suspend").click()
        page.get_by_role("button", name="Resume").wait_for()
        page.screenshot(path=str(SHOTS / "csrf-own-button.png"))
        assert suspended(namespace, "mine") is True
        assert errors == []
    finally:
        served.stop()


@pytest.fixture
def signed_in_view(namespace: str, stopped_operator: None) -> Iterator[tuple[str, str, str]]:
    """The view in the cluster (tokens reviewed) on ``localhost``; a run and a sweep to
    change; the token of an identity that may change them and of another one."""
    k8s.create(TrainingRunBuilder("mine", namespace).obj())
    k8s.create(SweepBuilder("tuning", namespace).obj())
    account(namespace, "victim", [*READS, "patch"])
    account(namespace, "mallory", READS)
    served = Served(
        app.make_app(
            source.LiveSource(), namespace="default", reviews=access.kubernetes_reviews(ttl=1.0)
        )
    )
    try:
        yield (
            served.url.replace("127.0.0.1", "localhost"),
            k8s.request_token(namespace, "victim", [], seconds=3600),
            k8s.request_token(namespace, "mallory", [], seconds=3600),
        )
    finally:
        served.stop()


def sign_in(page: Any, view: str, token: str) -> None:
    page.goto(f"{view}/login")
    page.get_by_label("Kubernetes token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/ns/*/runs")


def test_a_page_of_the_same_host_on_another_port_cannot_change_anything(
    signed_in_view: tuple[str, str, str], namespace: str, attacker: Attacker, chromium: Any
) -> None:
    view, victim, _ = signed_in_view
    leaked = Browser(view).token("/login")
    attacker.forge("/suspend", f"{view}/ns/{namespace}/runs/mine/suspend", {"token": leaked})
    attacker.forge("/cancel", f"{view}/ns/{namespace}/sweeps/tuning/cancel", {"token": leaked})
    context = chromium.new_context()
    page, errors = watched_page(context)
    sign_in(page, view, victim)
    same_site = f"http://localhost:{attacker.port}"
    for path in ("/suspend", "/cancel"):
        shot = f"csrf-same-site{path.replace('/', '-')}.png"
        text = forged(page, errors, same_site + path, shot)
        assert "403" in text and "Sec-Fetch-Site: same-site" in text, text
    assert not suspended(namespace, "mine")
    assert not k8s.get(k8s.SWEEPS, namespace, "tuning")["spec"].get("cancel")
    assert errors == []


def test_a_page_of_another_site_cannot_sign_the_browser_in_as_someone_else(
    signed_in_view: tuple[str, str, str], attacker: Attacker, chromium: Any
) -> None:
    view, victim, mallory = signed_in_view
    leaked = Browser(view).token("/login")
    attacker.forge("/login", f"{view}/login", {"token": leaked, "k8s_token": mallory})
    context = chromium.new_context()
    page, errors = watched_page(context)
    sign_in(page, view, victim)
    text = forged(page, errors, f"http://{EVIL}:{attacker.port}/login", "csrf-login.png")
    assert "403" in text and "changes nothing" in text, text
    cookies = {c["name"]: c["value"] for c in context.cookies(view)}
    assert cookies[access.COOKIE] == victim  # still the victim, not mallory
    # nor a browser that was signed out
    fresh = chromium.new_context()
    other, other_errors = watched_page(fresh)
    shot = "csrf-login-signed-out.png"
    text = forged(other, other_errors, f"http://{EVIL}:{attacker.port}/login", shot)
    assert "403" in text, text
    assert access.COOKIE not in {c["name"] for c in fresh.cookies(view)}
    assert errors == other_errors == []

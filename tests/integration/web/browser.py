"""What the web view's integration tests and ``benchmarks/ui.py`` share: Debian's
Chromium as Playwright launches it (``make browser`` installs both), the app served on
127.0.0.1 in a thread of its own, and a ServiceAccount with the rights a page reads."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from torchyard import k8s
from torchyard.web import app

try:
    from playwright import sync_api as playwright
except ImportError as err:  # not a skip: the integration tier includes these tests
    raise ImportError("the browser tests need Playwright and Chromium: run `make browser`") from err

REPO = Path(__file__).resolve().parents[3]
SHOTS = REPO / "build" / "web-screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READS = ["get", "list", "watch"]


class Served:
    """The web app on ``host`` (127.0.0.1) in a thread of its own, as ``torchyard ui``
    serves it (``torchyard.web.app.start``)."""

    def __init__(self, application: web.Application, host: str = "127.0.0.1") -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.app = application
        self.host = host
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner, self.url = self.loop.run_until_complete(app.start(self.app, self.host, 0))
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# A rank that prints ``tick N at UNIX-TIME`` every TICK_SECONDS (its own clock: the real
# node's Pods run on this machine, so the browser reads the same clock).
TICK_SECONDS = 0.3
TICKER = (
    "import time\n"
    "for i in range(100000):\n"
    f"    time.sleep({TICK_SECONDS})\n"
    "    print(f'tick {i} at {time.time():.3f}', flush=True)\n"
)
# In the page: when each tick line first shows in the log tail (ticks already there when
# it starts are not counted: they were written before the page looked); the page is marked
# ``data-ticks-seen`` once ``count`` were seen (a locator waits for that: the page's
# Content-Security-Policy allows no evaluated predicate).
WATCH_TICKS = """(count) => {
  const log = document.getElementById('log');
  const ticks = () => [...log.textContent.matchAll(/tick (\\d+) at (\\d+\\.\\d+)/g)];
  window.tyFirst = Math.max(-1, ...ticks().map(m => +m[1]));
  window.tySeen = {};
  new MutationObserver(() => {
    const now = Date.now() / 1000;
    for (const m of ticks())
      if (+m[1] > window.tyFirst && !(m[1] in window.tySeen)) window.tySeen[m[1]] = now - +m[2];
    if (Object.keys(window.tySeen).length >= count) document.body.dataset.ticksSeen = "1";
  }).observe(log, {childList: true, characterData: true, subtree: true});
}"""


def tick_delays(page: Any, count: int, timeout_ms: float = 60_000) -> list[float]:
    """Seconds from a rank's write of each of ``count`` new tick lines to the line on the
    run page (its log tail following), in the order written; waits for them to show."""
    page.locator("#log", has_text="tick ").wait_for(timeout=timeout_ms)
    page.evaluate(WATCH_TICKS, count)
    page.locator("body[data-ticks-seen]").wait_for(state="attached", timeout=timeout_ms)
    seen = page.evaluate("() => window.tySeen")
    return [float(seen[k]) for k in sorted(seen, key=int)][:count]


def watched_page(browser: Any, **options: Any) -> tuple[Any, list[str]]:
    """A new page of ``browser`` and the list its console errors, uncaught exceptions and
    dialogs go to (a page under test shows none)."""
    page = browser.new_page(**options)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("dialog", lambda d: errors.append(f"a dialog opened: {d.message}"))
    return page, errors


@contextlib.contextmanager
def browsing(application: web.Application) -> Iterator[tuple[str, Any, list[str]]]:
    """``application`` served, and a watched page (1280 x 900) of Chromium to open it
    with: (its URL, the page, the page's errors); :data:`SHOTS` made for screenshots."""
    served = Served(application)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page, errors = watched_page(browser, viewport={"width": 1280, "height": 900})
            yield served.url, page, errors
            browser.close()
    finally:
        served.stop()


def held_node_pod(namespace: str, run: str, node: int) -> dict[str, object]:
    """A node Pod of ``run`` as the operator labels them, held back from scheduling (KWOK
    leaves it alone), so that its state is what the test writes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{run}-node-{node}",
            "namespace": namespace,
            "labels": {"torchyard.dev/run": run, "torchyard.dev/node-rank": str(node)},
        },
        "spec": {
            "schedulingGates": [{"name": "torchyard.dev/test-held"}],
            "containers": [{"name": "trainer", "image": "pytorch"}],
        },
    }


def account(namespace: str, name: str, verbs: list[str]) -> None:
    """ServiceAccount ``name`` with ``verbs`` on the namespace's TrainingRuns, Sweeps,
    Environments and ModelVersions, and reads of what their pages show (Pods, their
    logs, Events, ConfigMaps)."""
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": name, "namespace": namespace}
    rules = [
        {
            "apiGroups": ["torchyard.dev"],
            "resources": ["trainingruns", "sweeps", "environments", "modelversions"],
            "verbs": verbs,
        },
        {
            "apiGroups": [""],
            "resources": ["pods", "pods/log", "events", "configmaps"],
            "verbs": READS,
        },
    ]
    k8s.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    k8s.create({"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": rules})
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    k8s.create(
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": ref,
            "subjects": [subject],
        }
    )


__all__ = [
    "CHROMIUM",
    "FLAGS",
    "READS",
    "SHOTS",
    "TICKER",
    "Served",
    "account",
    "held_node_pod",
    "playwright",
    "tick_delays",
    "watched_page",
]

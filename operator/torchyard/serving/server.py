"""The serving process (``python -m torchyard.serving`` in a serving Pod): the scoring
script's ``init()`` beside a Uvicorn server, and a drain before it stops.

:func:`main` reads the serving contract's variables (``contract``), starts Uvicorn on
``contract.PORT`` at once (the kubelet's liveness probe is answered while the model
loads) and runs ``init()`` on a thread of its own; the Pod is ready once it returned. When
``init()`` raises, the process writes the failure to its termination message (the runs'
shape: ``reason`` InitFailed, the exception's class, the traceback's tail) and exits with
``contract.INIT_FAILED_EXIT``, so that the endpoint's status names the failure instead of
a bare CrashLoopBackOff. On SIGTERM it first drains for ``TORCHYARD_DRAIN_SECONDS``:
not ready, every answer saying ``Connection: close``, while the Service's endpoints and
kube-proxy forget the Pod; then Uvicorn stops gracefully (answers in flight finish).

Runs in the Environment's image with the libraries the init container put first on
``PYTHONPATH`` (``prepare``). Tested in tests/unit/serving/test_server.py (a real process)
and on the real node (tests/node/test_endpoints_on_node.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchyard.launch.contract import TAIL_LINES, termination_message, write_termination
from torchyard.serving import contract

logger = logging.getLogger("torchyard.serving")
KEEP_ALIVE_SECONDS = 75


@dataclass(frozen=True)
class Settings:
    """The serving contract's variables, as the serving Pod's builder sets them."""

    entry_script: str
    model: str
    version: str
    max_body_bytes: int = 16 * 2**20
    timeout: float = 60.0
    concurrency: int = 4
    drain_seconds: float = contract.DEFAULT_DRAIN_SECONDS
    access_url: str = ""  # "": public
    registry_ca: str = ""
    termination_log: str = "/dev/termination-log"
    port: int = contract.PORT

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        c = contract
        return cls(
            entry_script=env.get(c.ENTRY_SCRIPT, "score.py"),
            model=env.get(c.MODEL_NAME, "model"),
            version=env.get(c.MODEL_VERSION, "1"),
            max_body_bytes=int(env.get(c.MAX_BODY_BYTES) or cls.max_body_bytes),
            timeout=float(env.get(c.REQUEST_TIMEOUT) or cls.timeout),
            concurrency=int(env.get(c.CONCURRENCY) or cls.concurrency),
            drain_seconds=float(env.get(c.DRAIN_SECONDS) or cls.drain_seconds),
            access_url=env.get(c.ACCESS_URL, ""),
            registry_ca=env.get(c.REGISTRY_CA, ""),
            termination_log=env.get(c.TERMINATION_LOG) or cls.termination_log,
            port=int(env.get(c.PORT_VARIABLE) or contract.PORT),
        )


def failure(reason: str, err: BaseException, exit_code: int) -> str:
    """The termination message of a serving process that stops on ``err``: the script's
    frames of the traceback (the runtime's own when it failed itself)."""
    try:
        from torchyard.serving.scoring import script_traceback

        text = script_traceback(err)
    except Exception:  # the runtime's own modules did not import
        text = "".join(traceback.format_exception(err)).rstrip()
    lines = text.splitlines()
    return termination_message(
        {
            "reason": reason,
            "exitCode": exit_code,
            "exception": type(err).__name__,
            "message": "\n".join(lines[-TAIL_LINES:]),
            "exitedAt": time.time(),
        }
    )


def _stop(reason: str, err: BaseException, exit_code: int, settings: Settings) -> int:
    message = failure(reason, err, exit_code)
    logger.error("%s:\n%s", reason, json.loads(message)["message"])
    write_termination(settings.termination_log, message)
    return exit_code


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    logging.basicConfig(
        level=logging.INFO,
        format="[torchyard-serving] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    settings = Settings.from_env(env)
    try:  # the runtime's own libraries (the init container's copies)
        import uvicorn

        from torchyard import __version__
        from torchyard.serving import app, auth, draining
    except Exception as err:  # an image whose Python is too old for them, a broken copy
        return _stop(contract.RUNTIME_FAILED, err, contract.RUNTIME_FAILED_EXIT, settings)
    access = None
    if settings.access_url:
        access = auth.Access(auth.ask_registry(settings.access_url, settings.registry_ca))
    state = app.State(
        settings.model, settings.version, settings.max_body_bytes, settings.timeout, access
    )
    config = uvicorn.Config(
        app.create_app(state, __version__),
        host="0.0.0.0",
        port=settings.port,
        access_log=False,
        timeout_graceful_shutdown=int(settings.timeout) + 5,
        # longer than the clients' and proxies' idle timeouts: a pooled connection is
        # closed by its client, not under a request it is sending
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        lifespan="off",
    )
    server = draining.DrainingServer(config, state, settings.drain_seconds)
    outcome: dict[str, int] = {}
    thread = threading.Thread(
        target=_initialize, args=(settings, state, server, outcome), name="init", daemon=True
    )
    thread.start()
    server.run()
    return outcome.get("exit", 0)


def _initialize(settings: Settings, state: Any, server: Any, outcome: dict[str, int]) -> None:
    """Load the entry script and call its init(); on success the Pod is ready."""
    from torchyard.serving import scoring

    logger.info(
        "loading %s; model %s version %s at %s",
        settings.entry_script,
        settings.model,
        settings.version,
        os.environ.get(contract.MODEL_DIR, "(unset)"),
    )
    try:
        scorer = scoring.Scorer(scoring.load(settings.entry_script), settings.concurrency)
        scorer.init()
    except BaseException as err:  # SystemExit of a script that calls sys.exit too
        outcome["exit"] = _stop(contract.INIT_FAILED, err, contract.INIT_FAILED_EXIT, settings)
        server.should_exit = True
        return
    state.scorer = scorer
    state.ready_gauge.set(1)
    logger.info("init() returned in %.2f s: ready", scorer.init_seconds or 0.0)

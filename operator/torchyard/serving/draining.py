"""Uvicorn's server with a drain: the first SIGTERM makes the Pod not ready and every
answer say ``Connection: close`` for ``drain_seconds`` (while the Service's endpoints and
kube-proxy forget the Pod, and keep-alive clients move to the Pods that stay), then the
server stops gracefully (answers in flight finish). A second signal, or SIGINT, stops it
at once (gracefully). Started by ``serving.server``; its drain is tested in
tests/unit/serving/test_server.py and, under load through a rollout, on the real node.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import uvicorn

from torchyard.serving.app import State

logger = logging.getLogger("torchyard.serving")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: State, drain_seconds: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_seconds = drain_seconds

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.state.draining or self.drain_seconds <= 0:
            super().handle_exit(sig, frame)
            return
        self.state.draining = True
        logger.info("SIGTERM: draining for %g s before stopping", self.drain_seconds)
        timer = threading.Timer(self.drain_seconds, self._drained)
        timer.daemon = True
        timer.start()

    def _drained(self) -> None:
        self.should_exit = True

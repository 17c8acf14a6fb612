"""The node launcher's side of in-place restarts (``coordination``): joining node 0's
coordinator, asking it what a failure means, stopping the ranks for a restart another node's
failure asked for, and starting them again in the same process, from the newest complete
checkpoint, with fresh stall clocks and log flags.

A mixin of ``node_launcher.Launcher`` (the state it shares is declared below). Standard
library only, Python >= 3.8. Tested with real launchers in
tests/unit/launcher/test_in_place.py.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from torchyard.launch import coordination
from torchyard.launch.contract import (
    TORCHYARD_CHECKPOINT_ATTEMPT,
    TORCHYARD_COORDINATOR,
    TORCHYARD_DNS_TIMEOUT,
    TORCHYARD_LOG_RULES,
    TORCHYARD_NNODES,
    TORCHYARD_RESTART_BUDGET,
    TORCHYARD_RESUME_FROM,
    TORCHYARD_RESUME_STEP,
    int_env,
)
from torchyard.launch.output import LogScanner
from torchyard.launch.ranks import Rank, oom_kills
from torchyard.launch.tracker import ProgressTracker


class InPlaceRestarts:
    """In-place restarts of a node launcher's ranks (TORCHYARD_COORDINATOR): node 0's
    coordinator, this node's line to it, whether the ranks were stopped for a restart,
    and why one under way did not happen (the termination message says it)."""

    coordinator: coordination.Coordinator | None = None
    peer: coordination.Peer | None = None
    _restarting = False
    _checkpoints_stopped = False
    # the coordinator answered this node's failure with a restart: it is no longer the
    # node's to report, even when the restart does not come (a signal, the barrier's end)
    restart_answered = False
    abandoned: str | None = None

    # The launcher's, as node_launcher.Launcher has them
    env: dict[str, str]
    cgroup: str
    ranks: list[Rank]
    stopping: int | None
    checkpoints: Any
    checkpoint_info: dict[str, Any]
    progress: ProgressTracker
    scanner: LogScanner
    stall: tuple[Rank, dict[str, Any]] | None
    _stall_check_at: float
    _node_ranks: dict[int, list[Any]]
    _save_until: float | None
    _oom_kills: int | None

    if TYPE_CHECKING:

        def say(self, text: str) -> None: ...

        def _failure_info(self, failed: Rank, node_rank: int) -> dict[str, Any]: ...

        def _start_checkpoints(self, node_rank: int) -> None: ...

        def _start_ranks(self, launch: str, nproc: int, node_rank: int, logs: str) -> None: ...

    def _join(self, node_rank: int, grace: int) -> None:
        """With TORCHYARD_COORDINATOR: node 0 serves the coordinator, and every node joins
        it (``coordination``); without, or when it cannot be reached, no in-place restart."""
        address = self.env.get(TORCHYARD_COORDINATOR, "")
        budget = self.env.get(TORCHYARD_RESTART_BUDGET, "")
        if not address or not budget:
            return
        try:
            if node_rank == 0:
                self.coordinator = coordination.Coordinator(
                    int(address.rpartition(":")[2]),
                    int_env(self.env, TORCHYARD_NNODES, 1),
                    coordination.Budget.parse(budget),
                    grace,
                    self.say,
                )
            self.peer = coordination.Peer(
                address, node_rank, int_env(self.env, TORCHYARD_DNS_TIMEOUT, 300), self.say
            )
        except (OSError, ValueError, KeyError) as err:
            self.say(f"no in-place restarts: cannot reach the coordinator at {address} ({err})")
            self._leave()

    def _stopped(self) -> bool:
        """SIGTERM or SIGINT came (the Pod is being deleted): no more waiting."""
        return self.stopping is not None

    def _leave(self) -> None:
        if self.peer is not None:
            self.peer.close()
        if self.coordinator is not None:
            self.coordinator.close()

    def _in_place(self, failed: Rank | None, node_rank: int) -> bool:
        """Whether the ranks start again in this Pod: the coordinator's verdict on a
        failure, a restart it asked for, or (every rank succeeded) the other nodes' end."""
        peer = self.peer
        if peer is None or self.stopping is not None:
            return False
        if failed is not None:
            if self.checkpoints is not None:  # NoProgress is the coordinator's to know
                self.checkpoint_info = self.checkpoints.stop(rank_failed=True)
                self._checkpoints_stopped = True
            if not peer.send(failed=self._failure_info(failed, node_rank)):
                return False
            answer = peer.wait("restart", stop=self._stopped)
        elif self._restarting:
            answer = {"restart": peer.restart_asked}
        else:  # every rank succeeded: the others may yet fail, and restart these too
            if not peer.send(done=True):
                return False
            answer = peer.wait("finish", "restart", stop=self._stopped)
        if answer is None or "restart" not in answer:
            if answer is not None and "end" in answer and failed is not None:
                self.say(str(answer.get("message") or "no in-place restart"))
            return False
        self.restart_answered = True
        if self.checkpoints is not None and not self._checkpoints_stopped:
            self.checkpoint_info = self.checkpoints.stop(rank_failed=failed is not None)
            self._checkpoints_stopped = True
        peer.send(ready=True)
        go = peer.wait("go", stop=self._stopped)
        if go is None and self.stopping is not None:
            return False  # stopped by a signal: the termination message says that
        if go is None or "go" not in go:
            why = (go or {}).get("message") or "the coordinator left"
            self.abandoned = f"the ranks stopped for an in-place restart that did not come: {why}"
            return False
        peer.generation = int(go["go"])
        peer.restart_asked = None
        return True

    def _next_generation(self, launch: str, nproc: int, node_rank: int, logs: str) -> None:
        """Start the ranks again, in place, from the newest complete checkpoint."""
        assert self.peer is not None
        self.say(f"restarting the ranks in place (generation {self.peer.generation})")
        self.ranks = []
        self.stall = None
        self._stall_check_at = 0.0
        self._node_ranks = {}
        self._restarting = False
        self.restart_answered = False
        self._save_until = None
        self.progress.close()
        self.progress = ProgressTracker(logs)  # the new ranks' stall clocks start afresh
        self.scanner = LogScanner(self.env.get(TORCHYARD_LOG_RULES, ""))
        self._oom_kills = oom_kills(self.cgroup)
        if self.checkpoints is not None:
            for name in (TORCHYARD_RESUME_FROM, TORCHYARD_RESUME_STEP):
                self.env.pop(name, None)
            base = self.env.get(TORCHYARD_CHECKPOINT_ATTEMPT, "").split("+", 1)[0]
            self.env[TORCHYARD_CHECKPOINT_ATTEMPT] = f"{base}+{self.peer.generation}"
            self.checkpoint_info = {}
            self._checkpoints_stopped = False
            self._start_checkpoints(node_rank)
        self._start_ranks(launch, nproc, node_rank, logs)

    def _step_of(self, rank: int | None) -> int | None:
        step = self.progress.step_of(rank)
        if step is None and self.checkpoints is not None:
            return self.checkpoints.resumed_from  # type: ignore[no-any-return]
        return step

    def _in_place_info(self) -> dict[str, Any]:
        """What the termination message and progress lines say of in-place restarts."""
        last = self.peer.last_restart if self.peer is not None else None
        if last is None:
            return {}
        return {"inPlace": {k: last.get(k) for k in coordination.REPORTED if k in last}}

    def _abandoned_info(self, node_rank: int) -> dict[str, Any]:
        """The termination message of a node whose ranks stopped for an in-place restart
        that did not come (the coordinator left, or a node did not stop in time)."""
        return {
            "nodeRank": node_rank,
            "reason": "Terminated",
            "exitCode": 128 + signal.SIGTERM,
            "message": self.abandoned,
            **self.checkpoint_info,
            **self._in_place_info(),
        }

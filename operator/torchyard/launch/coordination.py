"""In-place restarts: the node launchers of one run restart their ranks together, inside
the Pods they run in, instead of the operator recreating every Pod of the gang.

Node 0's launcher serves a :class:`Coordinator` on ``TORCHYARD_COORDINATOR``'s port; every
launcher (node 0's too) talks to it through a :class:`Peer`, one JSON object a line over
TCP (the Pod network the ranks' rendezvous already uses: no API access, no port the
operator must reach). A generation is one start of every node's ranks:

1. A launcher whose rank failed stops its other ranks (as without coordination) and sends
   the failure, the termination message it would write, to the coordinator.
2. When the failure may be a symptom of another (a collective timeout, a lost peer, a
   stall: :func:`settles`), the coordinator waits ``SETTLE_SECONDS`` for the other nodes'
   failures of the same generation (a peer that lost the failed rank fails a moment
   later); any other failure it decides on at once. It picks the failure
   the operator would (the first to exit, a cascade only when nothing explains it:
   ``classes.prefer``) and decides with :func:`decide`, the operator's failure policy for
   a failure of the user's code: restart in place while ``backoffLimit`` allows it, the
   class is retryable and not the node's fault, and it is not the same error at the same
   step as the restart before.
3. Restart: every launcher stops its ranks, says it is ready, and once all are (the
   barrier) starts them again from the newest complete checkpoint. The coordinator's log
   says each restart (``[torchyard] restarted-in-place {...}``), which the operator reads
   into the run's status and Events, with what the progress lines carry.
4. No restart: the failing launcher exits with its failure and the others go on as they
   would without coordination; the operator decides (a gang restart, another node, the
   run's failure) from the Pods, as it always did. A launcher that loses the coordinator
   (node 0's Pod gone) does the same.

Only what the launchers can do alone happens here: a Pod whose container or node is gone
is the operator's to replace. Standard library only, Python >= 3.8 (shipped to every node
Pod). Tested with real launchers in tests/unit/launcher/test_in_place.py and on the real
node in tests/node/test_in_place.py.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchyard.launch import classes
from torchyard.launch.contract import NO_PROGRESS_REASON, STALLED_REASON

# How long the coordinator waits after a generation's first failure for the others, when
# that failure may be a symptom of another's (``settles``).
SETTLE_SECONDS = 2.0
# How long, past the launchers' grace period, every node has to stop its ranks and say so.
BARRIER_SECONDS = 60.0
# The reasons a launcher reports that another start of the ranks cannot mend: too many
# attempts without progress from their checkpoint (``checkpoint.NodeCheckpoints.stop``).
NOT_RESTARTED = frozenset({NO_PROGRESS_REASON})
# Log rule actions that hand the failure to the operator (another node, no retry).
OPERATOR_ACTIONS = frozenset({"excludeNode", "cancelRetries"})
LINE_LIMIT = 1 << 20  # bytes of one message at most
# How long a launcher with something to tell waits for its line to the coordinator (node 0's
# Pod may still be starting); past it, it goes on as without coordination.
CONNECT_WAIT_SECONDS = 30.0
# What each launcher's termination message and progress lines say of the last in-place
# restart (``inPlace``): the counts so far, what failed and why it was restarted.
REPORTED = (
    "inPlace",
    "failedAttempts",
    "backoffLimit",
    "message",
    "signature",
    "failure",
    "failureClass",
    "at",
)


@dataclass(frozen=True)
class Budget:
    """What the operator counted before this Pod started (``TORCHYARD_RESTART_BUDGET``)."""

    backoff_limit: int
    failed_attempts: int  # failures of the user's code restarted so far, any way
    in_place: int = 0  # of those, the ones restarted in place
    last_signature: str | None = None  # ``classes.signature`` of the last restart's failure

    @classmethod
    def parse(cls, text: str) -> Budget:
        data = json.loads(text)
        return cls(
            int(data["backoffLimit"]),
            int(data["failedAttempts"]),
            int(data.get("inPlace") or 0),
            data.get("lastSignature") or None,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "backoffLimit": self.backoff_limit,
                "failedAttempts": self.failed_attempts,
                "inPlace": self.in_place,
                "lastSignature": self.last_signature,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    def after(self, failure: Mapping[str, Any]) -> Budget:
        """The budget once ``failure`` was restarted in place."""
        return Budget(
            self.backoff_limit,
            self.failed_attempts + 1,
            self.in_place + 1,
            classes.signature(failure),
        )


def classified(report: Mapping[str, Any]) -> dict[str, Any]:
    """A launcher's failure report with its class, as the operator gives it."""
    failure = dict(report)
    found = classes.classify(classes.evidence_of(report, report.get("evidence")))
    if found is not None:
        rule, matched = found
        failure["failureClass"] = rule.name
        failure["retryable"] = rule.retryable
        failure["nodeFault"] = rule.node_fault
        failure["matched"] = matched
    return failure


def first(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Of one generation's failure reports, the one the operator would name: the first to
    exit that is not a cascade when there is one (``classes.prefer``)."""
    ordered = sorted(
        (classified(r) for r in reports),
        key=lambda f: (f.get("exitedAt") is None, f.get("exitedAt") or 0.0),
    )
    chosen = classes.prefer(ordered)
    return dict(chosen) if chosen is not None else None


def settles(report: Mapping[str, Any]) -> bool:
    """Whether the coordinator waits for the generation's other failures before deciding
    on ``report`` (the operator's rule, ``status.failures.settle_seconds``): when it may be
    what a rank saw of another's failure (a cascade, a symptom), or a stall, which every
    node's stall detector may report; any other failure is decided at once."""
    failure = classified(report)
    rule = classes.BY_NAME.get(str(failure.get("failureClass") or ""))
    return failure.get("reason") == STALLED_REASON or (
        rule is not None and (rule.cascade or rule.symptom)
    )


def decide(failure: Mapping[str, Any], budget: Budget) -> str | None:
    """Why ``failure`` is not restarted in place, None when it is (the operator's failure
    policy for a failure of the user's code, ``controller.failure_policy.restart_kind``)."""
    if failure.get("reason") in NOT_RESTARTED:
        return f"{failure.get('reason')}: {failure.get('message') or ''}".strip()
    rule = failure.get("logRule")
    if isinstance(rule, Mapping) and rule.get("action") in OPERATOR_ACTIONS:
        return f"policy.logRules[{rule.get('index')}] says {rule.get('action')}"
    if failure.get("nodeFault"):
        return f"{failure.get('failureClass')} is the node's fault: the operator decides"
    if failure.get("retryable") is False:
        return f"{failure.get('failureClass')} is not retryable"
    if budget.last_signature is not None and budget.last_signature == classes.signature(failure):
        return "the same error at the same step as the restart before"
    if budget.failed_attempts >= budget.backoff_limit:
        return f"backoffLimit {budget.backoff_limit} used"
    return None


def last_line(failure: Mapping[str, Any]) -> str:
    lines = str(failure.get("message") or "").strip().splitlines()
    return lines[-1][:300] if lines else ""


def describe(failure: Mapping[str, Any]) -> str:
    """'rank 2 failed (signal 9)': what the restart's Event says of the failure."""
    who = f"rank {failure['rank']}" if failure.get("rank") is not None else "node"
    node = failure.get("nodeRank")
    how = (
        f"signal {failure['signal']}"
        if failure.get("signal")
        else f"exit code {failure.get('exitCode')}"
    )
    kind = f", {failure['failureClass']}" if failure.get("failureClass") else ""
    return f"{who} (node {node}) failed ({how}{kind})"


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall((json.dumps(message, sort_keys=True) + "\n").encode())


def _lines(sock: socket.socket) -> Any:
    """The JSON messages read from ``sock`` until it closes (a too long line ends it)."""
    with contextlib.suppress(OSError), sock.makefile("rb") as stream:
        while True:
            line = stream.readline(LINE_LIMIT + 1)
            if not line or len(line) > LINE_LIMIT:
                return
            try:
                message = json.loads(line)
            except ValueError:
                return
            if isinstance(message, dict):
                yield message


class Coordinator:
    """Node 0's: the generations of the run's ranks (see the module docstring)."""

    def __init__(
        self,
        port: int,
        nodes: int,
        budget: Budget,
        grace: float,
        say: Callable[[str], None],
        *,
        settle: float = SETTLE_SECONDS,
        barrier: float = BARRIER_SECONDS,
    ) -> None:
        self.nodes = nodes
        self.budget = budget
        self.say = say
        self.settle = settle
        self.barrier = grace + barrier
        self.generation = 0
        self.restarts: list[dict[str, Any]] = []  # every in-place restart: what and why
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}
        self._failures: dict[int, dict[int, dict[str, Any]]] = {}  # generation -> node -> report
        self._done: set[int] = set()
        self._ready: set[int] = set()
        self._ended: str | None = None  # why no generation follows: the end
        self._pending: dict[str, Any] | None = None  # the restart whose barrier is open
        self._server = socket.create_server(("", port), backlog=max(64, nodes))
        self.port = int(self._server.getsockname()[1])  # ``port``, or the one given for 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for sock in self._peers.values():
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        node: int | None = None
        for message in _lines(sock):
            hello = message.get("hello")
            if isinstance(hello, int) and not isinstance(hello, bool) and 0 <= hello < self.nodes:
                node = hello
                with self._lock:
                    old = self._peers.get(node)
                    self._peers[node] = sock
                    ended = self._ended
                    pending = self._pending
                if old is not None and old is not sock:
                    with contextlib.suppress(OSError):
                        old.close()
                if ended is not None:
                    self._tell(node, {"end": self.generation, "message": ended})
                elif pending is not None:  # a late joiner takes part in the restart too
                    self._tell(node, pending)
            elif node is not None:
                self._on(node, message)
        with self._lock:
            if node is not None and self._peers.get(node) is sock:
                del self._peers[node]
                lost = node not in self._done or bool(self._ready)
            else:
                lost = False
        if lost and node is not None:
            self._end(f"node {node}'s launcher left")

    def _on(self, node: int, message: Mapping[str, Any]) -> None:
        generation = message.get("generation")
        with self._lock:
            if generation != self.generation or self._ended is not None:
                stale = True
            else:
                stale = False
                if "failed" in message and isinstance(message["failed"], dict):
                    reports = self._failures.setdefault(self.generation, {})
                    first_one = not reports
                    reports[node] = dict(message["failed"])
                    if first_one:
                        wait = self.settle if settles(reports[node]) else 0.0
                        threading.Thread(
                            target=self._decide, args=(self.generation, wait), daemon=True
                        ).start()
                elif message.get("done"):
                    self._done.add(node)
                    if len(self._done) == self.nodes:
                        self._broadcast({"finish": self.generation})
                elif message.get("ready"):
                    self._ready.add(node)
                    if len(self._ready) == self.nodes:
                        self._go()
        if stale and self._ended is not None:
            self._tell(node, {"end": self.generation, "message": self._ended})

    def _decide(self, generation: int, wait: float) -> None:
        time.sleep(wait)
        with self._lock:
            if generation != self.generation or self._ended is not None:
                return
            failure = first(list(self._failures.get(generation, {}).values()))
            if failure is None:
                return
            why = decide(failure, self.budget)
            if why is not None:
                self._ended = f"not restarted in place: {why}"
                self._broadcast({"end": generation, "message": self._ended})
                self.say(f"{describe(failure)}: {self._ended}")
                return
            self.budget = self.budget.after(failure)
            restart = {
                "generation": generation + 1,
                "inPlace": self.budget.in_place,
                "failedAttempts": self.budget.failed_attempts,
                "backoffLimit": self.budget.backoff_limit,
                "failure": {
                    **{
                        k: failure.get(k)
                        for k in ("rank", "nodeRank", "exitCode", "signal", "reason", "step")
                        if failure.get(k) is not None
                    },
                    # its message's last line: what "the same error" compares (signature)
                    "lastLine": last_line(failure),
                },
                "failureClass": failure.get("failureClass"),
                "message": (
                    f"{describe(failure)}: restarted in place (restart {self.budget.in_place} "
                    f"in place, {self.budget.failed_attempts}/{self.budget.backoff_limit} of "
                    "backoffLimit used)"
                ),
                "signature": self.budget.last_signature,
                "at": round(time.time(), 3),
            }
            self.restarts.append(restart)
            self._ready = set()
            self._done = set()
            self._pending = {**restart, "restart": generation + 1}
            self._broadcast(self._pending)
        threading.Thread(target=self._deadline, args=(generation + 1,), daemon=True).start()
        self.say("restarted-in-place " + json.dumps(restart, sort_keys=True))

    def _deadline(self, generation: int) -> None:
        time.sleep(self.barrier)
        with self._lock:
            late = (
                self.generation < generation
                and self._ended is None
                and len(self._ready) < self.nodes
            )
            missing = sorted(set(range(self.nodes)) - self._ready)
        if late:
            self._end(f"node(s) {missing} did not stop their ranks within {self.barrier:.0f}s")

    def _go(self) -> None:
        """Every node stopped its ranks (under the lock): start the next generation."""
        self.generation += 1
        self._ready = set()
        self._pending = None
        self._broadcast({"go": self.generation})

    def _end(self, why: str) -> None:
        with self._lock:
            if self._ended is not None:
                return
            self._ended = f"no in-place restart: {why}"
            self._broadcast({"end": self.generation, "message": self._ended})
        self.say(self._ended)

    def _broadcast(self, message: Mapping[str, Any]) -> None:
        """Under the lock."""
        for sock in list(self._peers.values()):
            with contextlib.suppress(OSError):
                _send(sock, message)

    def _tell(self, node: int, message: Mapping[str, Any]) -> None:
        with self._lock:
            sock = self._peers.get(node)
        if sock is not None:
            with contextlib.suppress(OSError):
                _send(sock, message)


class Peer:
    """A launcher's side: its messages to the coordinator, and the coordinator's to it
    (``restart`` may come at any time; :meth:`wait` for the others)."""

    def __init__(
        self,
        address: str,
        node: int,
        timeout: float,
        say: Callable[[str], None] = lambda _: None,
        *,
        wait: float = CONNECT_WAIT_SECONDS,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.node = node
        self.generation = 0
        self.restart_asked: int | None = None  # a restart the coordinator asked for
        self.last_restart: dict[str, Any] | None = None  # the last one's record
        self.say = say
        self.connect_wait = wait
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._sock: socket.socket | None = None
        self._connected = threading.Event()
        # In the background: the ranks start meanwhile (node 0's Pod may start later than
        # this one, or have ended already: a launcher never waits on it to start them).
        threading.Thread(target=self._connect, args=(host, int(port), timeout), daemon=True).start()

    def _connect(self, host: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError as err:
                if time.monotonic() >= deadline:
                    self.say(f"no in-place restarts: the coordinator at {host}:{port} ({err})")
                    self._messages.put(None)
                    return
                time.sleep(0.2)
        sock.settimeout(None)
        try:
            _send(sock, {"hello": self.node, "generation": 0})
        except OSError:
            self._messages.put(None)
            return
        self._sock = sock
        self._connected.set()
        self._read(sock)

    def _read(self, sock: socket.socket) -> None:
        for message in _lines(sock):
            if "restart" in message:
                self.last_restart = message
                self.restart_asked = int(message["restart"])
            self._messages.put(message)
        self._messages.put(None)  # the coordinator is gone

    def connected(self, timeout: float) -> bool:
        """Whether the line to the coordinator is up (waiting at most ``timeout`` seconds)."""
        return self._connected.wait(timeout)

    def send(self, **message: Any) -> bool:
        """False when the coordinator cannot be told (not reached within ``connect_wait``
        seconds, or gone): the launcher goes on as without coordination."""
        if not self._connected.wait(self.connect_wait) or self._sock is None:
            return False
        try:
            _send(self._sock, {**message, "generation": self.generation})
            return True
        except OSError:
            return False

    def wait(self, *kinds: str, stop: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
        """The next message of one of ``kinds`` (or ``end``); None once the coordinator is
        gone, or as soon as ``stop`` says so (the launcher was told to stop)."""
        while True:
            try:
                message = self._messages.get(timeout=0.2)
            except queue.Empty:
                if stop():
                    return None
                continue
            if message is None:
                self._messages.put(None)
                return None
            if "end" in message or any(kind in message for kind in kinds):
                return message

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()

"""The in-process operator's errors fail the test that made them.

In the integration tier the operator runs in this process (``tests.conftest``'s
``InProcessOperator``): a reconcile, admission pass or Pod watch that raises is logged at
ERROR and retried (``controller.workqueue``, ``controller.handlers``,
``controller.pod_watch``), and Kopf logs a failed handler of ours at ERROR, so a bug that
succeeds on the second try would pass green. :class:`Guard` is a logging handler on the
``torchyard`` and ``kopf`` loggers that keeps those records, each with the test that was
running when it was logged (the operator logs from its own threads, at any time). The
operator runs with the chart's RBAC (``tests/cluster/chart.py``): every 403 its own
client gets is logged at ERROR on ``torchyard.rbac``, and Kopf's word that the apiserver
refused one of its requests (``APIForbiddenError``, "Not enough permissions", a WARNING
when it falls back) counts too.

- a test's window opens when pytest starts it and closes when the next test starts, so
  what its aftermath logs (its namespace being deleted) is still its own;
- at the end of its teardown, ``tests/integration/conftest.py`` fails the test with every
  record of its window so far that its ``expected_operator_errors`` marker does not allow;
- what it logs after that is *late*: reported at the end of the session, which then fails.

Records are kept only while an integration test runs (other tiers have no window).
Tested in ``tests/unit/cluster/test_operator_errors.py``.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field

LOGGERS = ("torchyard", "kopf")
# Kopf's ERROR records about a handler (ours: Kopf runs no others here), e.g. "Handler
# 'trainingrun_event' failed with an exception and will ignore it: ...". Its other ERROR
# records (a watch stream that broke while the control plane stopped) are not ours.
KOPF_HANDLER = re.compile(r"^(Handler|Activity) '.*' failed|Event processing has failed")
# Kopf's word that the apiserver refused it: a request (ERROR, then retried) or a list or
# watch it then goes without (WARNING).
KOPF_REFUSED = re.compile(r"APIForbiddenError|^Not enough permissions")


def counts(record: logging.LogRecord) -> bool:
    """An ERROR of torchyard's, Kopf's word that one of the handlers failed, or Kopf's
    word that the apiserver refused it (the operator's RBAC lacks something)."""
    kopf = record.name.startswith("kopf")
    if kopf and record.levelno >= logging.WARNING and KOPF_REFUSED.search(record.getMessage()):
        return True
    if record.levelno < logging.ERROR:
        return False
    if record.name == "torchyard" or record.name.startswith("torchyard."):
        return True
    return kopf and bool(KOPF_HANDLER.search(record.getMessage()))


def shown(record: logging.LogRecord) -> str:
    """One record as a failure lists it: logger, level, message and the exception."""
    text = f"{record.name} {record.levelname}: {record.getMessage()}"
    if record.exc_info and record.exc_info[1] is not None:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return text


@dataclass
class Window:
    """The records of one test: ``checked`` of them were looked at in its teardown."""

    test: str
    records: list[logging.LogRecord] = field(default_factory=list)
    checked: int = 0
    allowed: tuple[str, ...] = ()


class Guard(logging.Handler):
    """Keeps the operator's error records per test window (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)  # (Kopf's refusals: see counts)
        self._records_lock = threading.Lock()
        self.window: Window | None = None
        self.late: list[tuple[Window, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not counts(record):
            return
        with self._records_lock:
            if self.window is not None:
                self.window.records.append(record)

    def begin(self, test: str | None) -> None:
        """A test starts (``None``: one outside the integration tier). What the previous
        window got after its check is late."""
        with self._records_lock:
            old, self.window = self.window, (Window(test) if test is not None else None)
        if old is not None:
            self.late += [
                (old, r) for r in old.records[old.checked :] if not allowed(r, old.allowed)
            ]

    def check(self, allowed_patterns: Iterable[str]) -> list[logging.LogRecord]:
        """At the end of the test's teardown: its records since the last check that
        ``allowed_patterns`` (regular expressions, searched in :func:`shown`) do not allow."""
        with self._records_lock:
            window = self.window
            if window is None:
                return []
            window.allowed = tuple(allowed_patterns)
            new, window.checked = window.records[window.checked :], len(window.records)
        return [r for r in new if not allowed(r, window.allowed)]

    def install(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self)

    def uninstall(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self)


def allowed(record: logging.LogRecord, patterns: Iterable[str]) -> bool:
    text = shown(record)
    return any(re.search(pattern, text) for pattern in patterns)


def failure(test: str, records: list[logging.LogRecord]) -> str:
    """The message a test fails with: each record, and how to allow one it expects."""
    listed = "\n\n".join(shown(r) for r in records)
    return (
        f"the in-process operator logged {len(records)} error(s) during {test}:\n\n{listed}\n\n"
        "Fix the operator, or, when the test makes this error on purpose, allow it with "
        '@pytest.mark.expected_operator_errors("<regex>", reason="<why>")'
    )

"""The integration tier's guard (``tests/integration/operator_errors.py``): what the
in-process operator logs at ERROR, from its own threads, fails the test it was logged
during, unless that test says it expects it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from tests.integration import operator_errors


@pytest.fixture
def guard() -> Iterator[operator_errors.Guard]:
    installed = operator_errors.Guard()
    installed.install()
    yield installed
    installed.uninstall()


def from_the_operators_thread(logger: str, level: int, message: str, crash: bool = False) -> None:
    def log() -> None:
        try:
            if crash:
                raise KeyError("spec")
            logging.getLogger(logger).log(level, message)
        except KeyError:
            logging.getLogger(logger).exception(message)

    thread = threading.Thread(target=log)
    thread.start()
    thread.join()


def messages(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records]


def test_what_the_operator_logs_at_error_during_a_test_is_that_tests(
    guard: operator_errors.Guard,
) -> None:
    guard.begin("test_a")
    from_the_operators_thread(
        "torchyard.trainingrun", logging.ERROR, "TrainingRun ns/r: reconcile failed", crash=True
    )
    from_the_operators_thread("torchyard.controller", logging.ERROR, "the admission pass failed")
    from_the_operators_thread(
        "kopf.objects", logging.ERROR, "Handler 'trainingrun_event' failed with an exception"
    )
    from_the_operators_thread("torchyard.controller", logging.WARNING, "a conflict; retrying")
    refused = "Request attempt 1 failed; will retry: GET /api/v1/pods -> APIForbiddenError()"
    from_the_operators_thread("kopf._cogs.clients.api", logging.ERROR, refused)
    no_watch = "Not enough permissions to watch for namespaces: changes will not be noticed"
    from_the_operators_thread("kopf._core.reactor.observation", logging.WARNING, no_watch)
    from_the_operators_thread("kopf._core.reactor.observation", logging.INFO, no_watch)
    forbidden = "the apiserver refused the operator (the chart's RBAC): GET /api/v1/secrets"
    from_the_operators_thread("torchyard.rbac", logging.ERROR, forbidden)
    from_the_operators_thread("kopf._cogs.clients.watching", logging.ERROR, "stream closed")
    from_the_operators_thread("torchyardish", logging.ERROR, "another library")
    found = guard.check([])
    assert messages(found) == [
        "TrainingRun ns/r: reconcile failed",
        "the admission pass failed",
        "Handler 'trainingrun_event' failed with an exception",
        refused,
        no_watch,
        forbidden,
    ]
    text = operator_errors.failure("test_a", found)
    assert "KeyError: 'spec'" in text and "expected_operator_errors" in text
    assert guard.check([]) == []  # each record fails one check


def test_a_test_allows_the_errors_it_makes_on_purpose_and_no_others(
    guard: operator_errors.Guard,
) -> None:
    guard.begin("test_a")
    from_the_operators_thread("torchyard.registry", logging.ERROR, "upload refused", crash=True)
    from_the_operators_thread("torchyard.controller", logging.ERROR, "the admission pass failed")
    found = guard.check([r"KeyError: 'spec'"])  # matched in the traceback
    assert messages(found) == ["the admission pass failed"]


def test_what_comes_after_the_check_is_late_and_stays_its_tests(
    guard: operator_errors.Guard,
) -> None:
    guard.begin("test_a")
    assert guard.check(["expected"]) == []
    from_the_operators_thread("torchyard.controller", logging.ERROR, "an expected error")
    from_the_operators_thread("torchyard.controller", logging.ERROR, "namespace deleted: boom")
    guard.begin("test_b")
    assert [(w.test, r.getMessage()) for w, r in guard.late] == [
        ("test_a", "namespace deleted: boom")
    ]
    assert guard.check([]) == []  # not test_b's
    guard.begin(None)  # a test of another tier: nothing is kept
    from_the_operators_thread("torchyard.controller", logging.ERROR, "during a unit test")
    guard.begin("test_c")
    assert guard.check([]) == [] and len(guard.late) == 1

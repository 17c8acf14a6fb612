"""The CLI's one error, :class:`CliError` (a message for the user and the exit code), and
its exit codes (:data:`EXIT_CODES`, the table the generated CLI reference shows).

Commands raise it (or let the SDK's errors through); ``torchyard.cli.app`` catches it, and
those, once, and prints ``torchyard: error: <message>``, never a traceback. A command
returns :data:`OK` or :data:`FAILED` itself: a run's own exit code (a rank's) is in its
status and output, never the CLI's, so that 2 always means bad input.
"""

from __future__ import annotations

import signal

OK = 0
FAILED = 1  # the run (or sweep) failed; or the cluster or registry said no or was not there
BAD_INPUT = 2  # usage, a flag, a file or a resource that is not valid
TIMED_OUT = 124  # wait --timeout passed first
SIGNALED = 128  # + the signal's number: stopped by it
INTERRUPTED = SIGNALED + signal.SIGINT  # Ctrl-C
BROKEN_PIPE = SIGNALED + signal.SIGPIPE  # the reader of the output went away (| head)

# (code, what it means), in the CLI reference's order.
EXIT_CODES: tuple[tuple[str, str], ...] = (
    (str(OK), "done: the command did what was asked; a run or sweep it ran or followed succeeded"),
    (
        str(FAILED),
        "the run or sweep failed (its rank's own exit code is in its status and output), or "
        "the cluster or the registry refused or could not be reached",
    ),
    (str(BAD_INPUT), "bad input: usage, an unknown flag, a file or a resource that is not valid"),
    (str(TIMED_OUT), "`wait --timeout` passed before the run ended"),
    (
        f"{INTERRUPTED}, {SIGNALED + signal.SIGHUP}, {SIGNALED + signal.SIGTERM}",
        "interrupted (128 + the signal): 130 Ctrl-C (SIGINT), 129 SIGHUP, 143 SIGTERM; a "
        "local run stops its nodes, is recorded and says how to go on",
    ),
    (str(BROKEN_PIPE), "the reader of the output went away (piped into `head`): no more output"),
)


class CliError(Exception):
    """A mistake the user can fix, or a refusal: ``message`` says which and what to do;
    ``code`` is the exit status (:data:`BAD_INPUT` for usage and input, :data:`FAILED`
    for what failed)."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

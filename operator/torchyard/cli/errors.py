"""The CLI's one error: :class:`CliError`, a message for the user and the exit code.

Commands raise it (or let the SDK's errors through); ``torchyard.cli.app`` catches it, and
those, once, and prints ``torchyard: error: <message>``, never a traceback.
"""

from __future__ import annotations


class CliError(Exception):
    """A mistake the user can fix, or a refusal: ``message`` says which and what to do;
    ``code`` is the exit status (2 for usage and input, 1 for what failed)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

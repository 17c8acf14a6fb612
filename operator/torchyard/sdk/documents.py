"""The documents of a torchyard YAML file, read and checked once for every command that
takes one: ``torchyard validate``, ``run --local``, ``submit`` (with ``--dry-run``) and
``sweep submit``, so that one file gets one verdict, one message and one exit code
whichever command reads it.

:func:`load` reads the file ('-': standard input; a file without a document is refused);
:func:`check` parses every document of the ``torchyard.dev`` group with the operator's
own models (``api.parse_document``: the kind, the version, every field, the nearest
field of a typo) and a Sweep also as the sweeps core compiles it
(``tuning.plans.compile_spec``), and leaves the documents of other groups alone.
:class:`Invalid` carries one message per invalid document. Tested in
tests/unit/cli/test_validate.py.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchyard import api
from torchyard.api.parsing import document_name, is_torchyard, parse_document
from torchyard.tuning.plans import Invalid as SweepInvalid
from torchyard.tuning.plans import compile_spec


class EmptyFile(ValueError):
    """A file that holds no document."""


class Invalid(api.InvalidSpec):
    """Documents that do not parse: ``problems`` is one message per document
    (``Kind/name: field: what is wrong``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Checked:
    """One document: its body, and its model (None: not a torchyard.dev resource)."""

    body: dict[str, Any]
    model: (
        api.TrainingRun | api.Environment | api.Sweep | api.ModelVersion | api.OnlineEndpoint | None
    )

    @property
    def name(self) -> str:
        return document_name(self.body)


def load(path: str) -> list[Any]:
    """The documents of a YAML file ('-': standard input), empty ones left out; EmptyFile
    when none is left."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if not docs:
        where = "standard input" if path == "-" else path
        raise EmptyFile(f"{where} holds no resource (no YAML document in it)")
    return docs


def check_one(body: Any) -> Checked:
    """One document checked (InvalidSpec names what is wrong, ``Kind/name:`` first)."""
    if not is_torchyard(body):
        return Checked(body, None)
    model = parse_document(body)
    if isinstance(model, api.Sweep):
        try:
            compile_spec(model, body["spec"].get("parameters"))
        except SweepInvalid as err:
            raise api.InvalidSpec(f"{document_name(body)}: {err}") from None
    return Checked(body, model)  # type: ignore[arg-type]


def check(docs: Sequence[Any]) -> list[Checked]:
    """Every document checked; :class:`Invalid` with one message per invalid one."""
    checked, problems = [], []
    for body in docs:
        try:
            checked.append(check_one(body))
        except api.InvalidSpec as err:
            problems.append(str(err))
    if problems:
        raise Invalid(problems)
    return checked


__all__ = ["Checked", "EmptyFile", "Invalid", "check", "check_one", "load"]

"""What every Azure ML name of ``torchyard.sdk.azureml`` shares: the error vocabulary
(:class:`TorchyardSdkError` and the two Azure ML exceptions the guide catches),
:func:`refuse` for an argument torchyard cannot honour, and :func:`dns_name` for a
Kubernetes name made from an Azure one. Imported by every other module of the package;
tested in tests/unit/sdk/test_azureml_arguments.py and test_azureml.py.
"""

from __future__ import annotations

from typing import Any


class TorchyardSdkError(Exception):
    """Something the Azure ML SDK does that has another shape here; says what to do."""


class ComputeTargetException(TorchyardSdkError):
    """As ``azureml.core.compute_target.ComputeTargetException``."""


class ActivityFailedException(TorchyardSdkError):
    """A run failed (``wait_for_completion(raise_on_error=True)``); carries the traceback."""


def refuse(where: str, given: dict[str, tuple[Any, Any]], advice: str) -> None:
    """Raise for every argument given a value other than its default (value, default):
    an argument torchyard cannot honour is refused, never silently dropped."""
    bad = [name for name, (value, default) in given.items() if value != default]
    if bad:
        raise TorchyardSdkError(f"{where}: {', '.join(bad)} has no meaning here: {advice}")


def dns_name(name: str) -> str:
    """A Kubernetes name from an Azure one ('Tutorial-pytorch-birds' -> tutorial-pytorch-birds)."""
    out = "".join(c if c.isalnum() else "-" for c in name.lower())
    while "--" in out:
        out = out.replace("--", "-")
    out = out.strip("-")[:63].rstrip("-")
    if not out or not out[0].isalpha():
        out = "x-" + out
    return out


__all__ = ["ActivityFailedException", "ComputeTargetException", "TorchyardSdkError"]

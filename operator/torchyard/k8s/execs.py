"""A command run in a Pod's container through the apiserver's exec API (a websocket to the
kubelet), its standard output read as bytes (:func:`pod_exec_output`). Used by
``torchyard tensorboard`` (``sdk.tensorboard``) to copy a running node's TensorBoard
event files out as a tar stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import urllib3.exceptions
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL

from torchyard.k8s import connections, errors, rest

# The most of a command's standard error kept for its error message.
STDERR_BYTES = 4096


class OutputTooLarge(Exception):
    """The command wrote more than the caller's limit to its standard output."""


@dataclass(frozen=True)
class ExecResult:
    """What the command wrote, its exit code (0, or what the kubelet reported) and the
    start of its standard error."""

    stdout: bytes
    exit_code: int
    stderr: str


def _exit_code(status: str) -> int:
    """The exit code in the error channel's Status (``{"status": "Success"}`` or a
    ``NonZeroExitCode`` with its ``ExitCode`` cause); 1 when it says nothing else."""
    try:
        parsed = json.loads(status) if status else {"status": "Success"}
    except ValueError:
        return 1
    if not isinstance(parsed, dict):
        return 1
    if parsed.get("status") == "Success":
        return 0
    for cause in (parsed.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"])
    return 1


def pod_exec_output(
    namespace: str,
    pod: str,
    command: Sequence[str],
    *,
    container: str | None = None,
    limit_bytes: int,
    timeout: float = 60,
    api: ApiClient | None = None,
) -> ExecResult:
    """Run ``command`` in the Pod's ``container`` (no shell unless the command is one) and
    read its standard output, at most ``limit_bytes`` (:class:`OutputTooLarge` beyond).
    :class:`ApiError` when the apiserver refuses (no such Pod, no ``pods/exec`` right),
    :class:`Unreachable` when it does not answer."""
    core = CoreV1Api(api or connections.load())
    rest.REQUESTS["GET"] += 1
    try:
        ws = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=list(command),
            container=container or "",
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            binary=True,
            _preload_content=False,
            _request_timeout=timeout,
        )
    except ApiException as exc:
        raise errors.from_exception(exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise errors.unreachable(err) from None
    out, err_text, status = bytearray(), bytearray(), b""
    try:
        while ws.is_open():
            ws.update(timeout=timeout)
            out += ws.read_channel(STDOUT_CHANNEL) or b""
            if len(err_text) < STDERR_BYTES:
                err_text += ws.read_channel(STDERR_CHANNEL) or b""
            status += ws.read_channel(ERROR_CHANNEL) or b""
            if len(out) > limit_bytes:
                raise OutputTooLarge(f"{pod}: more than {limit_bytes} bytes of output")
    except OSError as err:  # the websocket broke off
        raise errors.unreachable(err) from None
    finally:
        ws.close()
    stderr = bytes(err_text[:STDERR_BYTES]).decode("utf-8", "replace").strip()
    return ExecResult(bytes(out), _exit_code(status.decode("utf-8", "replace")), stderr)


__all__ = ["ExecResult", "OutputTooLarge", "pod_exec_output"]

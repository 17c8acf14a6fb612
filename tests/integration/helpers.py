"""Helpers of the integration tests: waiting on status, finishing KWOK Pods."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.cluster.harness import Cluster
from torchyard import k8s


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def wait_status(
    res: k8s.Resource,
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], Any],
    timeout: float = 30,
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def matched() -> dict[str, Any] | None:
        nonlocal last
        last = k8s.get(res, namespace, name)
        return last if check(last.get("status") or {}) else None

    try:
        result: dict[str, Any] = wait_for(f"status of {name}", matched, timeout)
    except AssertionError:
        raise AssertionError(
            f"status of {name} never matched: {json.dumps(last.get('status'), indent=1)}"
        ) from None
    return result


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def run_pods(namespace: str, run: str) -> list[dict[str, Any]]:
    return sorted(
        k8s.list_(k8s.PODS, namespace, label_selector=f"torchyard.dev/run={run}"),
        key=lambda p: p["metadata"]["name"],
    )


def finish_pod(
    cluster: Cluster, namespace: str, pod: str, exit_code: int, message: str = "", reason: str = ""
) -> None:
    """Make KWOK end a running Pod with this exit code and termination message."""
    args = [
        "annotate",
        "pod",
        pod,
        "-n",
        namespace,
        "--overwrite",
        f"kwok.torchyard.dev/exit-code={exit_code}",
    ]
    if message:
        args.append(f"kwok.torchyard.dev/message={message}")
    if reason:
        args.append(f"kwok.torchyard.dev/reason={reason}")
    cluster.kubectl(*args)


def launcher_message(rank: int, node: int, exception: str) -> str:
    """What the launcher writes to the termination log for a failing rank."""
    return json.dumps(
        {
            "rank": rank,
            "localRank": rank % 2,
            "nodeRank": node,
            "exitCode": 1,
            "reason": "Error",
            "message": "Traceback (most recent call last):\n"
            f'  File "train.py", line 9\n{exception}',
        }
    )

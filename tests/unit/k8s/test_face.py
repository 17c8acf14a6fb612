"""``torchyard.k8s`` is a face over modules by concern: every name callers use
(``k8s.apply``, ``k8s.PODS`` ...) is still there, and ``__init__.py`` defines nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from torchyard import k8s

FACE = {
    # resources
    "Resource", "resource_of", "CONFIGMAPS", "CRDS", "ENVIRONMENTS", "EVENTS", "JOBS",
    "MODELVERSIONS", "NAMESPACES", "NODES", "PERSISTENTVOLUMECLAIMS", "PODS", "ROLEBINDINGS",
    "ROLES", "SECRETS", "SERVICEACCOUNTS", "SERVICES", "SUBJECTACCESSREVIEWS", "TOKENREVIEWS",
    "TRAININGRUNS", "SWEEPS", "PRIORITYCLASSES", "KUEUE_GROUP", "LOCALQUEUES_CRD", "local_queues",
    "ONLINEENDPOINTS", "DEPLOYMENTS", "HORIZONTALPODAUTOSCALERS", "INFERENCESERVICES",
    "INFERENCESERVICES_CRD", "KSERVE_GROUP",
    "KUEUE_VERSION", "WORKLOADS", "WORKLOADS_CRD", "TOPOLOGIES", "RESOURCEFLAVORS",
    # connections
    "Connection", "configure", "connection", "default_namespace", "load", "proxy_url", "reset",
    # clients
    "Client",
    # rest, errors
    "FIELD_MANAGER", "REQUESTS", "apply", "apply_status", "create", "delete", "get",
    "get_or_none", "list_", "merge_patch", "ApiError", "Unreachable",
    # events, logs, reviews
    "events_of", "record_event", "pod_log_lines", "allowed", "request_token", "review_token",
    # watches
    "WatchStream", "list_versioned",
    # execs
    "ExecResult", "OutputTooLarge", "pod_exec_output",
}  # fmt: skip
MODULES = {
    "clients", "connections", "errors", "events", "execs", "logs", "resources", "rest",
    "reviews", "watches",
}  # fmt: skip


def test_the_face_holds_every_public_name_and_its_modules() -> None:
    assert {n for n in dir(k8s) if not n.startswith("_")} == FACE | MODULES


def test_each_name_is_the_one_its_module_defines() -> None:
    for module in MODULES:
        for name in getattr(k8s, module).__all__:
            assert getattr(k8s, name) is getattr(getattr(k8s, module), name), name


def test_init_is_only_a_face() -> None:
    source = Path(k8s.__file__).read_text()
    assert len(source.splitlines()) <= 40
    body = ast.parse(source).body
    assert all(isinstance(node, ast.ImportFrom | ast.Expr) for node in body)

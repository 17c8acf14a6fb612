"""One set of credentials of its own: :class:`Client` is the calls of ``torchyard.k8s``
bound to an ``ApiClient`` that nothing else shares.

The package's functions (``k8s.get``, ``k8s.apply`` ...) use the shared default client
(``connections.load``), which the CLI, the SDK and the registry service use. The operator
never does: ``controller.operators`` makes a :class:`Client` (in a Pod from its
ServiceAccount, else from the kubeconfig; the integration tests pass one with a token of
the chart's ServiceAccount while they themselves stay admin on the shared one), and every
request of the operator, Kopf's included (its login handler), goes out with its
credentials. tests/unit/controller/test_own_client.py holds the controller to that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes.client import ApiClient

from torchyard.k8s import connections, events, logs, rest, watches
from torchyard.k8s.resources import Resource


class Client:
    """``torchyard.k8s``'s calls with ``api``'s credentials (``controller.context.K8s``)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    @classmethod
    def configured(cls, kubeconfig: str | None = None, context: str | None = None) -> Client:
        """A client of its own: in a Pod its ServiceAccount's, else the kubeconfig's."""
        return cls(connections.configure(kubeconfig, context))

    def connection(self) -> connections.Connection:
        return connections.connection(self.api)

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return rest.get(res, namespace, name, api=self.api)

    def get_or_none(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        return rest.get_or_none(res, namespace, name, api=self.api)

    def list_(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        return rest.list_(
            res,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            api=self.api,
        )

    def list_versioned(
        self, res: Resource, namespace: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        return watches.list_versioned(res, namespace, api=self.api)

    def watch(
        self, res: Resource, namespace: str | None, version: str, *, timeout_seconds: int = 300
    ) -> watches.WatchStream:
        return watches.WatchStream(
            res, namespace, version, timeout_seconds=timeout_seconds, api=self.api
        )

    def create(
        self, manifest: dict[str, Any], *, field_manager: str | None = None
    ) -> dict[str, Any]:
        return rest.create(manifest, field_manager=field_manager, api=self.api)

    def apply(
        self,
        manifest: dict[str, Any],
        *,
        field_manager: str = rest.FIELD_MANAGER,
        subresource: str = "",
    ) -> dict[str, Any]:
        return rest.apply(
            manifest, field_manager=field_manager, subresource=subresource, api=self.api
        )

    def apply_status(
        self, manifest: dict[str, Any], *, field_manager: str = rest.FIELD_MANAGER
    ) -> dict[str, Any]:
        return rest.apply_status(manifest, field_manager=field_manager, api=self.api)

    def merge_patch(
        self, res: Resource, namespace: str | None, name: str, patch: dict[str, Any], **options: Any
    ) -> dict[str, Any]:
        """``rest.merge_patch`` (its ``subresource``)."""
        return rest.merge_patch(res, namespace, name, patch, **options, api=self.api)

    def delete(self, res: Resource, namespace: str | None, name: str, **options: Any) -> bool:
        """``rest.delete`` (its ``propagation``, ``grace_period_seconds``)."""
        return rest.delete(res, namespace, name, **options, api=self.api)

    def record_event(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, *, now: str
    ) -> dict[str, Any] | None:
        return events.record_event(obj, type_, reason, message, now=now, api=self.api)

    def pod_log_lines(self, namespace: str, pod: str, **options: Any) -> Iterator[str]:
        """``logs.pod_log_lines`` (its ``container``, ``tail_lines``, ``limit_bytes`` ...)."""
        return logs.pod_log_lines(namespace, pod, **options, api=self.api)


__all__ = ["Client"]

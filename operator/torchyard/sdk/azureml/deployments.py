"""What a deployed model's Pods get, with the Azure ML SDK's names:
``AciWebservice.deploy_configuration`` and ``AksWebservice.deploy_configuration`` return a
:class:`DeploymentConfiguration`, which ``Model.deploy`` (``webservices``) turns into the
OnlineEndpoint's CPU, memory, GPUs, replicas or autoscaling, limits and ``public``.
Arguments with no meaning on a cluster (keys, TLS, regions, Application Insights) are
refused. Tested in tests/unit/sdk/test_webservices.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torchyard.sdk.azureml.common import TorchyardSdkError, refuse


@dataclass
class DeploymentConfiguration:
    """What ``deploy_configuration`` gives: the serving Pods' size, count and limits."""

    cpu_cores: float | None = None
    memory_gb: float | None = None
    gpu_cores: int | None = None
    replicas: int = 1
    autoscale: tuple[int, int, int] | None = None  # (min, max, target CPU percent)
    auth_enabled: bool | None = None
    timeout_seconds: int | None = None
    concurrency: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    description: str | None = None

    def spec(self) -> dict[str, Any]:
        """The OnlineEndpoint spec fields this configuration sets."""
        spec: dict[str, Any] = {"replicas": self.replicas}
        resources: dict[str, Any] = {}
        if self.cpu_cores is not None:
            resources["cpu"] = f"{max(1, round(self.cpu_cores * 1000))}m"
        if self.memory_gb is not None:
            resources["memory"] = f"{max(1, round(self.memory_gb * 1024))}Mi"
        if self.gpu_cores:
            resources["gpus"] = int(self.gpu_cores)
        if resources:
            spec["resources"] = resources
        if self.autoscale is not None:
            low, high, target = self.autoscale
            spec["autoscaling"] = {
                "minReplicas": low,
                "maxReplicas": high,
                "targetCpuUtilization": target,
            }
        limits: dict[str, Any] = {}
        if self.timeout_seconds is not None:
            limits["requestTimeoutSeconds"] = self.timeout_seconds
        if self.concurrency is not None:
            limits["concurrency"] = self.concurrency
        if limits:
            spec["limits"] = limits
        if self.auth_enabled is False:
            spec["public"] = True
        return spec


_UNSUPPORTED = (
    "keys, TLS, regions, virtual networks and Application Insights are the cluster's: a "
    "caller authenticates with a Kubernetes token, TLS and the Service's reach are the "
    "cluster's ingress, metrics are on the Pods' /metrics"
)


class AciWebservice:
    @staticmethod
    def deploy_configuration(
        cpu_cores: float | None = None,
        memory_gb: float | None = None,
        tags: dict[str, str] | None = None,
        properties: dict[str, str] | None = None,
        description: str | None = None,
        location: str | None = None,
        auth_enabled: bool | None = None,
        ssl_enabled: bool | None = None,
        enable_app_insights: bool | None = None,
        ssl_cert_pem_file: str | None = None,
        ssl_key_pem_file: str | None = None,
        ssl_cname: str | None = None,
        dns_name_label: str | None = None,
        primary_key: str | None = None,
        secondary_key: str | None = None,
        collect_model_data: bool | None = None,
        gpu_cores: int | None = None,
    ) -> DeploymentConfiguration:
        refuse(
            "AciWebservice.deploy_configuration",
            {
                "location": (location, None),
                "ssl_enabled": (ssl_enabled, None),
                "enable_app_insights": (enable_app_insights, None),
                "ssl_cert_pem_file": (ssl_cert_pem_file, None),
                "ssl_key_pem_file": (ssl_key_pem_file, None),
                "ssl_cname": (ssl_cname, None),
                "dns_name_label": (dns_name_label, None),
                "primary_key": (primary_key, None),
                "secondary_key": (secondary_key, None),
                "collect_model_data": (collect_model_data, None),
            },
            _UNSUPPORTED,
        )
        return DeploymentConfiguration(
            cpu_cores=cpu_cores,
            memory_gb=memory_gb,
            gpu_cores=gpu_cores,
            auth_enabled=auth_enabled,
            tags={**(properties or {}), **(tags or {})},
            description=description,
        )


class AksWebservice:
    @staticmethod
    def deploy_configuration(
        autoscale_enabled: bool | None = None,
        autoscale_min_replicas: int | None = None,
        autoscale_max_replicas: int | None = None,
        autoscale_refresh_seconds: int | None = None,
        autoscale_target_utilization: int | None = None,
        collect_model_data: bool | None = None,
        auth_enabled: bool | None = None,
        cpu_cores: float | None = None,
        memory_gb: float | None = None,
        enable_app_insights: bool | None = None,
        scoring_timeout_ms: int | None = None,
        replica_max_concurrent_requests: int | None = None,
        max_request_wait_time: int | None = None,
        num_replicas: int | None = None,
        primary_key: str | None = None,
        secondary_key: str | None = None,
        tags: dict[str, str] | None = None,
        properties: dict[str, str] | None = None,
        description: str | None = None,
        gpu_cores: int | None = None,
        namespace: str | None = None,
        token_auth_enabled: bool | None = None,
    ) -> DeploymentConfiguration:
        refuse(
            "AksWebservice.deploy_configuration",
            {
                "autoscale_refresh_seconds": (autoscale_refresh_seconds, None),
                "collect_model_data": (collect_model_data, None),
                "enable_app_insights": (enable_app_insights, None),
                "max_request_wait_time": (max_request_wait_time, None),
                "primary_key": (primary_key, None),
                "secondary_key": (secondary_key, None),
                "namespace": (namespace, None),
            },
            _UNSUPPORTED + "; the namespace is the workspace's",
        )
        if num_replicas is not None and autoscale_enabled:
            raise TorchyardSdkError(
                "AksWebservice.deploy_configuration: num_replicas fixes the Pod count, "
                "autoscale_enabled lets it move: give one of them"
            )
        # Azure's defaults: autoscaling 1..10 at 70 % CPU unless num_replicas is given,
        # 0.1 CPU per replica (the autoscaler needs a CPU request).
        scale = autoscale_enabled if autoscale_enabled is not None else num_replicas is None
        autoscale = None
        if scale:
            autoscale = (
                autoscale_min_replicas or 1,
                autoscale_max_replicas or 10,
                autoscale_target_utilization or 70,
            )
        timeout = math.ceil(scoring_timeout_ms / 1000) if scoring_timeout_ms else None
        return DeploymentConfiguration(
            cpu_cores=cpu_cores if cpu_cores is not None else (0.1 if scale else None),
            memory_gb=memory_gb,
            gpu_cores=gpu_cores,
            replicas=num_replicas or 1,
            autoscale=autoscale,
            auth_enabled=False if (auth_enabled is False and not token_auth_enabled) else None,
            timeout_seconds=timeout,
            concurrency=replica_max_concurrent_requests,
            tags={**(properties or {}), **(tags or {})},
            description=description,
        )


__all__ = ["AciWebservice", "AksWebservice", "DeploymentConfiguration"]

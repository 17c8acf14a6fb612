"""torchyard's resources in a cluster, as a user handles them: submitting Environments and
TrainingRuns (server-side apply under the caller's field manager), the dry run of a
submission (exactly the manifests the operator would make, from its own planner), and
reading runs, environments and models.

Called by ``torchyard submit`` and ``torchyard get`` (``torchyard.cli.submit``,
``torchyard.cli.inspect``) and by scripts; reads and writes go through ``torchyard.k8s``,
manifests come from ``torchyard.planning``. Tested in tests/unit/cli/test_commands.py (the dry run)
and tests/integration/test_cli.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from torchyard import api, k8s
from torchyard.planning import pods, topology, workloads
from torchyard.sdk import snapshots

Kind = Literal["runs", "envs", "models"]
KINDS: dict[Kind, k8s.Resource] = {
    "runs": k8s.TRAININGRUNS,
    "envs": k8s.ENVIRONMENTS,
    "models": k8s.MODELVERSIONS,
}


def get(kind: Kind, namespace: str, name: str) -> dict[str, Any]:
    """One run, environment or model (ApiError 404 when there is none)."""
    return k8s.get(KINDS[kind], namespace, name)


def list_(kind: Kind, namespace: str) -> list[dict[str, Any]]:
    """Every run, environment or model of the namespace."""
    return k8s.list_(KINDS[kind], namespace)


def apply(body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
    """Create or update an Environment or TrainingRun (server-side apply, forced, under
    ``field_manager``: the fields the caller sets are the caller's)."""
    return k8s.apply(body, field_manager=field_manager)


def dry_run(
    runs: Iterable[dict[str, Any]],
    environments: dict[str, dict[str, Any]],
    namespace: str,
    snapshot: snapshots.Snapshot | None = None,
) -> list[dict[str, Any]]:
    """What submitting ``runs`` (with ``environments``, by name, and the source
    ``snapshot``) would create: the snapshot's ConfigMap when it fits one, the
    Environments, then each run with its headless Service and node Pods (a queued run's
    Kueue Workload first), as the operator plans them (with the Environment's image when
    it names one), after the ConfigMap of the modules shipped to node Pods (the launcher)
    that the operator applies first."""
    out: list[dict[str, Any]] = []
    if snapshot is not None and snapshot.fits_configmap:
        out.append(snapshots.configmap(snapshot, namespace))
    out += list(environments.values())
    bodies = list(runs)
    if bodies:
        out.append(pods.launcher_config_map(namespace))
    for body in bodies:
        run = api.parse_trainingrun(body)
        env = environments.get(run.spec.environment, {}).get("spec", {})
        image = env.get("image") or f"<image of Environment {run.spec.environment}>"
        out += [body, pods.service(run)]
        out += _gang(run, image, env.get("python", "python3"))
    return out


def _gang(run: api.TrainingRun, image: str, python: str) -> list[dict[str, Any]]:
    """A queued run's Kueue Workload and its node Pods as created once Kueue admits it
    (before its flavors and domains are known); else the gated node Pods, with their
    placement (its level alone: the cluster's Kueue Topology is not read here)."""
    request = topology.request(run.spec.placement) if run.spec.placement else None
    if not run.spec.scheduling.queue_name:
        return pods.pods(run, image=image, python=python, placement=request)
    count = run.spec.distribution.node_count
    return [
        workloads.workload(run, count, request=request),
        *pods.pods(run, image=image, python=python, gated=False),
    ]


__all__ = ["KINDS", "Kind", "apply", "dry_run", "get", "list_"]

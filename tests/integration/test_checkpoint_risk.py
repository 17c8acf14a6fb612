"""CheckpointAtRisk on the real control plane (KWOK nodes): once the run's
``status.progress.checkpointSeconds`` (what the launchers report of the ranks' slowest step
and save, written here as the progress poll would) exceed the Pods'
terminationGracePeriodSeconds, the operator's status of the Running run carries the
warning, and the CRD's schema keeps the timings."""

from __future__ import annotations

from tests.builders import TrainingRunBuilder
from tests.integration.helpers import conditions, wait_status
from tests.integration.test_checkpoints import volume  # noqa: F401 (a fixture)
from tests.integration.test_trainingruns import running
from torchyard import api, k8s


def test_a_grace_period_shorter_than_the_slowest_step_and_save_is_warned_about(
    env: str,
    volume: str,  # noqa: F811
) -> None:
    ns = env
    k8s.create(
        TrainingRunBuilder("risky", ns)
        .environment("pytorch")
        .nodes(1)
        .procs(1)
        .gpus(1)
        .pool("a100")
        .with_("spec.policy.terminationGracePeriodSeconds", 30)
        .with_("spec.checkpoints", {"size": "1Gi", "storageClassName": volume})
        .obj()
    )
    before = running(ns, "risky", timeout=60)
    assert "CheckpointAtRisk" not in conditions(before)  # nothing timed yet
    k8s.apply_status(
        {
            "apiVersion": api.API_VERSION,
            "kind": "TrainingRun",
            "metadata": {"name": "risky", "namespace": ns},
            "status": {"progress": {"step": 40, "checkpointSeconds": {"step": 12.5, "save": 25.0}}},
        },
        field_manager="test-progress",
    )
    warned = wait_status(
        k8s.TRAININGRUNS,
        ns,
        "risky",
        lambda s: conditions({"status": s}).get("CheckpointAtRisk", {}).get("status") == "True",
        timeout=60,
    )
    risk = conditions(warned)["CheckpointAtRisk"]
    assert risk["reason"] == "GracePeriodTooShort"
    assert "set spec.policy.terminationGracePeriodSeconds to 50 or more" in risk["message"]
    assert warned["status"]["phase"] == "Running"
    assert warned["status"]["progress"]["checkpointSeconds"] == {"step": 12.5, "save": 25.0}

"""Kopf peering with ``--peering-name``: the operator (a process of its own as the chart's
ServiceAccount with the chart's RBAC for peering in one namespace, the session's
in-process operator stopped) registers in the KopfPeering of that name, acts while it is
the only peer, pauses when a peer with a higher priority appears (what a second replica
of the chart's Deployment does to it) and resumes when that peer leaves, and takes its
record out of the peering object when it stops. The peering CRDs are the chart's."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.builders import TrainingRunBuilder
from tests.cluster import chart
from tests.cluster.chart import CHART
from tests.cluster.harness import Cluster
from tests.integration.helpers import OperatorProcess, wait_for, wait_status
from torchyard import k8s

PEERING = "torchyard-test"


def peering_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "kopfpeering", PEERING, "-n", namespace, "-o", "json")
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def set_peer(cluster: Cluster, namespace: str, peer: str, record: dict[str, Any] | None) -> None:
    patch = json.dumps({"status": {peer: record}})
    cluster.kubectl("patch", "kopfpeering", PEERING, "-n", namespace, "--type=merge", "-p", patch)


def reconciled(namespace: str, name: str) -> dict[str, Any]:
    k8s.create(TrainingRunBuilder(name, namespace).obj())
    return wait_status(
        k8s.TRAININGRUNS, namespace, name, lambda s: s.get("observedGeneration") == 1
    )


def test_the_operator_peers_through_its_named_kopfpeering(
    cluster: Cluster, namespace: str, stopped_operator: None, tmp_path: Path
) -> None:
    ns = namespace
    cluster.kubectl("apply", "--server-side", "-f", str(CHART / "crds" / "kopf-peerings.yaml"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=30s"
    )
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(peering))
    args = ["--namespace", ns, "--peering-name", PEERING]
    log = tmp_path / "operator.log"
    peering_rbac = ("--set", "operator.peering=true", "--set", f"operator.peeringName={PEERING}")
    with (
        chart.namespaced_operator(cluster, ns, tmp_path / "rbac", *peering_rbac) as kubeconfig,
        OperatorProcess(kubeconfig, log, *args, POD_ID="peer-a") as proc,
    ):
        try:
            # It registers in the peering object named by --peering-name, and acts.
            me = wait_for(
                "the operator's record in its KopfPeering",
                lambda: peering_status(cluster, ns).get("peer-a"),
                timeout=60,
            )
            assert (me["priority"], me["lifetime"]) == (0, 60)
            reconciled(ns, "first")

            # A peer with a higher priority appears: this one pauses ...
            now = datetime.now(timezone.utc).isoformat()
            set_peer(cluster, ns, "peer-b", {"priority": 100, "lifetime": 60, "lastseen": now})
            wait_for("the pause", lambda: "Pausing operations in favour of" in proc.text())
            # ... and resumes when it leaves (it also said so once at start: mandatory
            # peering starts paused until the peering object shows no other peer).
            resumed = proc.text().count("Resuming operations")
            set_peer(cluster, ns, "peer-b", None)
            wait_for("the resumption", lambda: proc.text().count("Resuming operations") > resumed)
            reconciled(ns, "second")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- operator log:\n{proc.text()[-4000:]}") from None
    assert proc.process.returncode == 0, proc.text()[-3000:]
    assert chart.forbidden_lines(proc.text()) == [], proc.text()[-3000:]
    # A stopped operator takes its record out, so that the others need not wait for it.
    assert "peer-a" not in peering_status(cluster, ns)

"""The MPI key Secret: created once with the run's first Pods, owned by the run, and
kept (never rotated) by later reconciles; PyTorch runs get none."""

from __future__ import annotations

from tests.unit.controller.world import NS, UID, env, gpu_node, reconcile, run, world
from torchyard import k8s

NODES = [gpu_node("gpu-0"), gpu_node("gpu-1")]


def test_an_mpi_run_gets_its_key_secret_before_its_pods_and_keeps_it() -> None:
    fake = world(run(spec={"distribution.type": "mpi"}), env(), *NODES)
    reconcile(fake)
    secret = fake.get(k8s.SECRETS, NS, "r-mpi")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert len(secret["data"]["key"]) > 40
    kinds = [m["kind"] for m in fake.applied]
    assert kinds.index("Secret") < kinds.index("Pod")
    pod = fake.get(k8s.PODS, NS, "r-1")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "mpi-key")
    assert volume["secret"]["secretName"] == "r-mpi"
    key = secret["data"]["key"]
    for name in ("r-0", "r-1"):  # a new attempt creates its Pods again
        fake.delete(k8s.PODS, NS, name)
    reconcile(fake, at=10)
    assert fake.get_or_none(k8s.PODS, NS, "r-0") is not None
    assert fake.get(k8s.SECRETS, NS, "r-mpi")["data"]["key"] == key


def test_a_pytorch_run_gets_no_secret() -> None:
    fake = world(run(), env(), *NODES)
    reconcile(fake)
    assert fake.get_or_none(k8s.SECRETS, NS, "r-mpi") is None

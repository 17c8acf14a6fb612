"""The shipped modules' ConfigMap (the launcher) reaches a namespace before its first node
Pods, and is applied once per operator, not once per gang (admission.ship)."""

from __future__ import annotations

import logging
from datetime import timedelta

from tests.unit.controller import world
from tests.unit.controller.fake_k8s import FakeK8s
from torchyard import k8s
from torchyard.controller import admission, context, trainingruns
from torchyard.planning import pods


def _kinds(fake: FakeK8s) -> list[tuple[str, str]]:
    return [(m["kind"], m["metadata"]["name"]) for m in fake.applied]


def test_the_launcher_config_map_is_applied_before_the_pods_and_once_per_namespace() -> None:
    fake = world.world(world.run(), world.env(), world.gpu_node("gpu-0"), world.gpu_node("gpu-1"))
    now = [world.T0]
    ctx = context.Context(clock=lambda: now[0], k8s=fake)
    admission.prime(ctx)
    body = fake.get(k8s.TRAININGRUNS, world.NS, "r")
    trainingruns.reconcile(body, logging.getLogger("test"), ctx)

    name = pods.launcher_config_map(world.NS)["metadata"]["name"]
    applied = _kinds(fake)
    assert applied.index(("ConfigMap", name)) < applied.index(("Pod", "r-0"))
    stored = fake.get(k8s.CONFIGMAPS, world.NS, name)
    assert (
        stored["data"] == pods.launcher_config_map(world.NS)["data"] and stored["immutable"] is True
    )
    pod = fake.get(k8s.PODS, world.NS, "r-0")
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "torchyard"]
    assert volume["configMap"]["name"] == name

    # the gang's Pods are gone (a restart): created again, the ConfigMap not applied again
    def recreate(after: float) -> list[tuple[str, str]]:
        for node in (0, 1):
            fake.delete(k8s.PODS, world.NS, f"r-{node}")
        fake.applied.clear()
        now[0] = world.T0 + timedelta(seconds=after)
        trainingruns.reconcile(body, logging.getLogger("test"), ctx)
        assert ("Pod", "r-0") in _kinds(fake)
        return [k for k in _kinds(fake) if k[0] == "ConfigMap"]

    assert recreate(admission.SHIP_REFRESH_SECONDS - 1) == []
    # ... until the last apply is old: then once more (a namespace made again gets it back)
    fake.delete(k8s.CONFIGMAPS, world.NS, name)
    assert recreate(admission.SHIP_REFRESH_SECONDS + 1) == [("ConfigMap", name)]
    assert (
        fake.get(k8s.CONFIGMAPS, world.NS, name)["data"]
        == pods.launcher_config_map(world.NS)["data"]
    )

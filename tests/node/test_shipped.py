"""The modules shipped to node Pods, on the REAL node: the PyTorch image has no torchyard
installed, yet the launcher runs and a rank imports ``torchyard`` from the operator's
``torchyard-launcher-<hash>`` ConfigMap, mounted read-only, with no init container.

Fixtures: ``env``/``real_operator`` and ``real_node`` (tests/node/conftest.py); the Pod's
spec.nodeName and ``pods/log`` come from the kubelet.
"""

from __future__ import annotations

import json

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.integration.helpers import run_pods
from tests.node import runs
from torchyard import k8s
from torchyard.planning import pods

pytestmark = pytest.mark.node


RANK = (
    "import json, os, sys, torchyard, torchyard.launch.main\n"
    "print('shipped', json.dumps({'package': os.path.dirname(torchyard.__file__),\n"
    "    'launcher': torchyard.launch.main.__file__, 'path': os.environ['PYTHONPATH'],\n"
    "    'uid': os.getuid()}), flush=True)\n"
)


def test_a_rank_imports_the_shipped_torchyard_package_without_an_init_container(
    cluster: Cluster, env: str, real_node: RealNode
) -> None:
    ns, name = env, "shipped"
    body = (
        TrainingRunBuilder(name, ns)
        .environment("pytorch")
        .source(image=True)
        .command("python", "-c", RANK)
        .procs(1)
        .pool(real_node.pool)
        .with_("spec.resources", dict(runs.RESOURCES))
        .with_("spec.runAsUser", 1000)
        .obj()
    )
    k8s.create(body)
    run = runs.finished(ns, name, timeout=180)
    assert run["status"]["phase"] == "Succeeded", runs.explain(cluster, ns, name)
    [pod] = run_pods(ns, name)
    runs.on_real_node([pod], real_node, 1)
    assert "initContainers" not in pod["spec"]
    assert runs.container(pod, "trainer")["state"]["terminated"]["exitCode"] == 0
    # the Pod mounts the ConfigMap the operator applied in this namespace
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "torchyard"]
    shipped = k8s.get(k8s.CONFIGMAPS, ns, volume["configMap"]["name"])
    assert shipped["data"] == pods.launcher_config_map(ns)["data"]
    text = runs.logs(cluster, ns, pod["metadata"]["name"])
    line = next(x for x in text.splitlines() if x.startswith("[rank 0] shipped "))
    seen = json.loads(line.split("shipped ", 1)[1])
    assert seen["package"] == pods.SHIPPED_PACKAGE
    assert seen["launcher"] == pods.LAUNCHER_PATH
    assert seen["path"].split(":")[0] == pods.SHIPPED_ROOT
    assert seen["uid"] == 1000

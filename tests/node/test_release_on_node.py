"""The release on the REAL node: what ``make images`` and ``make chart PUSH=<registry>`` do
(``tests/cluster/release.py``, the same functions), pushed to a registry of the harness
on this machine's address, then ``helm install oci://<registry>/torchyard/charts/torchyard
--version <version>`` with no image override but ``imageRegistry``: the registry host.

- the operator image is the release's build (buildah, from ``images/operator``), with its
  SBOM (syft: the Python packages at the versions of requirements.lock) and provenance;
  containerd pulls it from the registry (plain HTTP, ``RealNode.pull_over_http``), and
  the kubelet runs the Pod from the pushed digest;
- the curated CPU image: **a stand-in**. ``images/pytorch-cpu`` installs torch from
  PyTorch's CPU index, which the test machines cannot reach, so the harness's Debian
  training image (``tests/cluster/images.py``: Debian's torch, CPU) is pushed under the
  release's name for it (``torchyard/pytorch:<torch>-cpu``); the chart's curated
  Environment names it through ``imageRegistry``, the operator resolves its tag to the
  pushed digest, and the TrainingRun's Pod runs that digest;
- the model registry service is off (``tests/node/test_chart_on_node.py`` covers it), to
  keep this cheap.

Fixtures: ``cluster``, ``operator`` (tests/conftest.py), ``real_node``
(tests/node/conftest.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import torchyard
from tests.cluster import binaries, release
from tests.cluster.chart import Helm
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.cluster.registry import OciRegistry, push_archive
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address
from tests.integration.helpers import wait_status
from tests.node.test_chart_on_node import (
    SMALL,
    Release,
    _ready,
    delete_namespaces,
    restricted_namespaces,
    run_hello,
)
from torchyard import k8s

# the release writes each image's SBOM with syft: built before the tests (tests/cluster/needs.py)
pytestmark = [pytest.mark.node, pytest.mark.usefixtures("syft")]

TRAIN = """\
import os
print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
"""


@dataclass
class Published:
    """What the release pushed: the registry, the images' entries, the chart's address."""

    registry: OciRegistry
    images: dict[str, dict[str, Any]]
    cpu_digest: str
    chart: str
    helm_home: Path


@pytest.fixture(scope="module")
def published(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    reg = OciRegistry(address=_host_address()).start()
    try:
        real_node.pull_over_http(reg.host)
        out = tmp_path_factory.mktemp("release")
        built = release.build_images(["torchyard"], out, sbom=True, log=False)
        release.push_images(built, reg.host, auth={}, insecure=True)
        [cpu] = [i for i in release.release_images() if i.name == "pytorch-cpu"]
        stand_in = real_node.images["pytorch"].archive
        push_archive(reg, stand_in, cpu.repository, cpu.tag)
        home = tmp_path_factory.mktemp("helm")
        package = release.package_chart(out, home=home)
        chart = release.push_chart(package, reg.host, plain_http=True, home=home)
        images = {e["name"]: e for e in built}
        yield Published(reg, images, release.archive_digest(stand_in), chart, home)
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster,
    real_node: RealNode,
    operator: InProcessOperator,
    published: Published,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    suffix = os.urandom(2).hex()
    system, team = restricted_namespaces(cluster, "ty-rel", suffix)
    host = published.registry.host
    on_real_node = {"torchyard.dev/pool": real_node.pool}
    values = {
        "imageRegistry": host,  # the one image setting: where the release was pushed
        "watchNamespaces": [team],
        "operator": {
            "nodeSelector": on_real_node,
            "resources": SMALL,
            # the test registry speaks plain HTTP (the curated tags resolve through it)
            "extraEnv": [{"name": "TORCHYARD_INSECURE_REGISTRIES", "value": host}],
        },
        "registry": {"enabled": False},
    }
    path = tmp_path_factory.mktemp("values") / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    binaries.build(binaries.TOOLS["helm"])
    helm = Helm(published.helm_home)
    name = f"ty-{suffix}"
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", system]
    operator.stop()  # only the chart's operator reconciles the team namespace
    try:
        version = ["--version", torchyard.__version__, "--plain-http"]
        helm("install", name, published.chart, *version, *kubeconfig, "--values", str(path))
        yield Release(name, system, team, published.helm_home, cluster, real_node)
    finally:
        helm("uninstall", name, *kubeconfig, "--wait", "--timeout=120s", check=False)
        delete_namespaces(cluster, team, system)
        operator.start()


def test_make_images_writes_the_sbom_and_provenance_of_what_it_built(
    published: Published,
) -> None:
    entry = published.images["torchyard"]
    assert entry["ref"] == f"ghcr.io/torchyard/torchyard:{torchyard.__version__}"
    assert entry["digest"] == release.archive_digest(Path(entry["archive"]))
    sbom = json.loads(Path(entry["sbom"]).read_text())
    assert sbom["spdxVersion"].startswith("SPDX-2.")
    found = {p["name"].lower().replace("_", "-"): p.get("versionInfo") for p in sbom["packages"]}
    lock = (release.REPO / "requirements.lock").read_text().splitlines()
    pins = dict(line.lower().replace("_", "-").split("==") for line in lock if "==" in line)
    for package in ("kopf", "kubernetes", "pydantic", "prometheus-client"):
        assert found.get(package) == pins[package], (package, found.get(package))
    assert found.get("torchyard") == torchyard.__version__
    purls = [r["referenceLocator"] for p in sbom["packages"] for r in p.get("externalRefs", [])]
    assert any(purl.startswith("pkg:deb/") for purl in purls)  # the base's Debian packages
    statement = json.loads(Path(entry["provenance"]).read_text())
    assert statement["subject"][0]["digest"]["sha256"] == entry["digest"].removeprefix("sha256:")


def test_the_chart_from_oci_runs_the_pushed_operator_and_a_training_run(
    installed: Release, published: Published, real_node: RealNode
) -> None:
    host = published.registry.host
    try:
        pod = real_node.wait_for(
            "the operator Pod Ready",
            lambda: next((p for p in installed.pods("operator") if _ready(p)), None),
            240,
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{installed.explain()}") from None
    assert pod["spec"]["nodeName"] == real_node.name
    [status] = pod["status"]["containerStatuses"]
    operator_digest = published.images["torchyard"]["digest"]
    assert status["image"] == f"{host}/torchyard/torchyard:{torchyard.__version__}", status
    assert status["imageID"].endswith(f"@{operator_digest}"), status  # pulled, that digest
    # the chart's curated CPU Environment, its tag resolved by the operator in the registry
    try:
        env = wait_status(
            k8s.ENVIRONMENTS,
            installed.team,
            "pytorch-cpu",
            lambda s: s.get("phase") == "Ready",
            240,
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{installed.explain()}") from None
    [cpu] = [i for i in release.release_images() if i.name == "pytorch-cpu"]
    assert env["spec"]["image"] == cpu.ref(host)
    resolved = f"{host}/{cpu.repository}@{published.cpu_digest}"
    assert env["status"]["image"] == resolved, env["status"]
    # a TrainingRun in it runs that digest, pulled from the registry
    _, run_pod, _ = run_hello(installed, "pytorch-cpu", TRAIN)
    trainer = next(s for s in run_pod["status"]["containerStatuses"] if s["name"] == "trainer")
    assert trainer["imageID"].endswith(f"@{published.cpu_digest}"), trainer

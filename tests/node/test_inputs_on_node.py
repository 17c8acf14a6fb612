"""Inputs on the real kubelet node: the birds example trains on images it reads from a
``model://`` input. The operator's fetch Job runs the torchyard image on the node (CPU
only, no Kubernetes API token, the run's ServiceAccount's registry token) and fills the
namespace's cache claim from the registry service (the KWOK nodes are cordoned: a fetch
Job, as a build Job, has no node selector); the run's Pod mounts the entry
read-only and finds it through ``$TORCHYARD_INPUT_BIRDS`` in its arguments; a second
run of the same input fetches nothing. An https input of each archive suffix is
unpacked by its fetch Job, and a hostile zip fails its run naming the member."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.conftest import InProcessOperator
from tests.integration.conftest import _host_address
from tests.integration.helpers import run_pods
from tests.integration.test_registry_service import Service, trainer_token
from tests.node.runs import (
    BIRDS,
    RESOURCES,
    explain,
    finished,
    operator_with,
    submit,
)
from tests.unit.inputs import server
from torchyard import api, k8s
from torchyard.inputs import archives
from torchyard.planning import inputs, names
from torchyard.registry import Store

pytestmark = pytest.mark.node


def birds_run(name: str, namespace: str, node: RealNode, *command: str) -> dict[str, object]:
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command(*command)
        .nodes(1)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
        .with_("spec.serviceAccountName", "trainer")
        .with_("spec.inputs", [{"name": "birds", "uri": "model://birds-images/1"}])
        .obj()
    )


def test_the_birds_example_trains_on_images_from_a_model_input(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    registry: tuple[Service, str, str],
    cache_class: str,
    only_real_node: RealNode,  # (the fetch Job has no node selector)
    tmp_path: Path,
) -> None:
    ns = env
    svc, url, _ = registry
    trainer_token(ns)  # ServiceAccount trainer: get and create on modelversions
    sys.path.insert(0, str(BIRDS))
    try:
        birds_data = importlib.import_module("birds_data")
    finally:
        sys.path.remove(str(BIRDS))
    data = tmp_path / "data"
    data.mkdir()
    size = os.path.getsize(birds_data.save(str(data), 80))
    Store(svc.root).publish(ns, "birds-images", data)
    first = birds_run(
        "birds", ns, real_node,
        "python", "pytorch_train.py", "--num_epochs", "1", "--pretrain_epochs", "1",
        "--data_dir", "$TORCHYARD_INPUT_BIRDS", "--output_dir", "./outputs",
    )  # fmt: skip
    again = birds_run(
        "again", ns, real_node,
        "python", "-c", "import os, sys; print('listed', sorted(os.listdir(sys.argv[1])))",
        "${TORCHYARD_INPUT_BIRDS}",
    )  # fmt: skip
    with operator_with(
        operator,
        TORCHYARD_REGISTRY_URL=url,
        TORCHYARD_INPUTS_STORAGE_CLASS=cache_class,
        TORCHYARD_INPUTS_CACHE_SIZE="1Gi",  # the volume's 2Gi hold it
    ):
        submit(cluster, tmp_path, first, source=BIRDS)
        run = finished(ns, "birds", timeout=300)
        assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, "birds")
        submit(cluster, tmp_path, again, source=BIRDS)
        second = finished(ns, "again", timeout=120)
        assert second["status"]["phase"] == "Succeeded", explain(cluster, ns, "again")

    [got] = run["status"]["inputs"]
    assert got["uri"] == "model://birds-images/1" and got["revision"] == "1"
    assert got["bytes"] == size and got["fetchedBytes"] == size
    assert second["status"]["inputs"][0]["fetchedBytes"] == 0
    assert second["status"]["inputs"][0]["digest"] == got["digest"]
    key = inputs.keys(api.parse_trainingrun(first))["birds"]
    job = k8s.get(k8s.JOBS, ns, names.input_fetch(key))
    assert job["status"].get("succeeded") == 1, "one fetch Job, which succeeded on the node"
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    log = cluster.kubectl("logs", run_pods(ns, "birds")[0]["metadata"]["name"], "-n", ns)
    assert "read 80 bird images from /torchyard/inputs/birds" in log, log
    listed = cluster.kubectl("logs", run_pods(ns, "again")[0]["metadata"]["name"], "-n", ns)
    assert "listed ['birds.npz']" in listed, listed


LISTS_ITS_INPUTS = """\
import os, sys
for root in sys.argv[1:]:
    for folder, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            path = os.path.join(folder, name)
            print("seen", os.path.relpath(path, "/torchyard/inputs"), open(path).read())
"""


def test_an_archive_of_each_kind_the_docs_list_is_unpacked_by_the_fetch_job(
    cluster: Cluster,
    env: str,
    real_node: RealNode,
    operator: InProcessOperator,
    cache_class: str,
    only_real_node: RealNode,  # (the fetch Job has no node selector)
    tmp_path: Path,
) -> None:
    """One run with an https input of every archive suffix, each fetched by its Job on the
    node (its staging file has no suffix); a hostile zip fails a second run naming it."""
    ns = env
    kinds = {"a" + s.replace(".", "_"): s for s in archives.SUFFIXES}  # a_tar_gz: .tar.gz
    bodies = {name: server.archive(s, {"d/f.txt": name.encode()}) for name, s in kinds.items()}
    hostile = server.archive(".zip", {"ok.txt": b"x", "../evil.txt": b"x"})
    files = server.Files({f"/{n}{kinds[n]}": body for n, body in bodies.items()})
    files.files["/hostile.zip"] = hostile
    source = tmp_path / "source"
    source.mkdir()
    (source / "list.py").write_text(LISTS_ITS_INPUTS)
    with server.serving(files, host=_host_address()) as url:
        specs = [
            {"name": n, "uri": f"{url}/{n}{kinds[n]}", "sha256": sha256(bodies[n])} for n in kinds
        ]
        args = [f"${{TORCHYARD_INPUT_{n.upper()}}}" for n in kinds]
        listing = archives_run("archives", ns, real_node, specs, args)
        bad = {"name": "hostile", "uri": f"{url}/hostile.zip", "sha256": sha256(hostile)}
        refused = archives_run("hostile", ns, real_node, [bad], ["$TORCHYARD_INPUT_HOSTILE"])
        with operator_with(
            operator,
            TORCHYARD_INPUTS_STORAGE_CLASS=cache_class,
            TORCHYARD_INPUTS_CACHE_SIZE="1Gi",  # the volume's 2Gi hold it
        ):
            submit(cluster, tmp_path, listing, source=source)
            submit(cluster, tmp_path, refused, source=source)
            run = finished(ns, "archives", timeout=300)
            assert run["status"]["phase"] == "Succeeded", explain(cluster, ns, "archives")
            failed = finished(ns, "hostile", timeout=300)
    log = cluster.kubectl("logs", run_pods(ns, "archives")[0]["metadata"]["name"], "-n", ns)
    for name in kinds:
        assert f"seen {name}/d/f.txt {name}" in log, log
    assert failed["status"]["phase"] == "Failed", explain(cluster, ns, "hostile")
    failure = failed["status"]["failure"]
    assert failure["reason"] == "InputFetchFailed", failure
    assert failure["message"].startswith(f"input hostile ({url}/hostile.zip): "), failure
    assert "outside its folder ('..'): '../evil.txt'" in failure["message"], failure


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def archives_run(
    name: str, namespace: str, node: RealNode, specs: list[dict[str, str]], args: list[str]
) -> dict[str, object]:
    return (
        TrainingRunBuilder(name, namespace)
        .environment("pytorch")
        .command("python", "list.py", *args)
        .nodes(1)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", dict(RESOURCES))
        .with_("spec.runAsUser", 1000)
        .with_("spec.inputs", specs)
        .obj()
    )

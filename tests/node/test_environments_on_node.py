"""An Environment built for real: the operator (in-process) plans the build Job, the
kubelet runs the builder in the base image on the REAL node as a non-root user, pip
installs from an index this test serves, the image goes to the harness's OCI registry, and
a TrainingRun then runs in the built image, pulled from that registry by containerd.

What is real here and where it lives:

- the registry: CNCF distribution (``tests/cluster/registry.py``) on this machine's
  non-loopback address, so the build Pod (its own network namespace) and containerd (on
  the host) both reach it; token auth as a public registry does it: pushing needs the
  credentials (the Environment's ``registry.pushSecret``, a dockerconfigjson Secret),
  pulling is anonymous, so the kubelet pulls with no imagePullSecrets; containerd speaks
  plain HTTP to it through ``certs.d/<host:port>/hosts.toml`` (``RealNode.pull_over_http``);
- the base image: the locally made ``python`` image (Debian's Python and pip), pushed to
  the registry from its cached archive with the builder's own client, so the builder can
  copy (mount) its layer and the kubelet pulls it like any base image;
- the pip index: a PEP 503 "simple" index served by this test on the same address,
  holding a wheel made here (Pods reach nothing outside the machine), given to the build
  through the Environment's ``pipIndexUrl``.

Each test checks ``spec.nodeName`` of the Pods and reads their outcome from the kubelet
(container states, ``pods/log``), so none passes on a KWOK node or with faked work. While
a test builds, the KWOK nodes are cordoned: a build Job has no node selector, and a build
Pod on a KWOK node would never run.

Fixtures: ``real_node`` (tests/node/conftest.py), ``operator`` and ``namespace``
(tests/conftest.py). Conda recipes are not built here: no conda tool (conda, mamba,
micromamba) installs from the package registries this machine reaches, and no conda
channel is reachable either (see docs/how-to/environments.md).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import TrainingRunBuilder, environment, wheel
from tests.cluster import chart
from tests.cluster.harness import Cluster
from tests.cluster.realnode import RealNode
from tests.cluster.registry import OciRegistry, push_archive
from tests.integration.conftest import _host_address
from tests.integration.helpers import run_pods, wait_for, wait_status
from tests.node.runs import container, explain, finished, logs
from torchyard import envbuild, k8s
from torchyard.planning import environments

pytestmark = pytest.mark.node

PUSHER = ("envpusher", "push-only-with-this")
PACKAGE, VERSION = "birdsong", "3.1.4"  # the wheel this test makes and serves
BUILD_USER = 65532  # planning/environments.py's build Pod runs as this user
BUILD_TIMEOUT = 420  # pulling the ~190 MB base image and building on 2 shared cores


# -- what the build needs on this machine ---------------------------------------------------


def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel (a module that knows its version, a console script), offline."""
    module = f"__version__ = {version!r}\n\ndef song():\n    return 'tweet'\n"
    return wheel(folder, name, version, module, f"{name} = {name}:song")


@pytest.fixture(scope="module")
def pip_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 simple index on this machine's address: ``/simple/<name>/`` lists the
    project's files (the standard library's directory listing is such a page)."""
    root = tmp_path_factory.mktemp("pypi")
    make_wheel(root / "simple" / PACKAGE, PACKAGE, VERSION)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    address = _host_address()
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def oci(real_node: RealNode) -> Iterator[tuple[OciRegistry, str]]:
    """The registry where the node's Pods and containerd reach it, and the base image in it."""
    reg = OciRegistry(token=PUSHER, address=_host_address(), anonymous_pull=True).start()
    try:
        real_node.pull_over_http(reg.host)
        python = real_node.images["python"]
        base = push_archive(reg, python.archive, "python", python.key, auth=push_auth(reg))
        yield reg, base
    finally:
        reg.stop()


def push_auth(reg: OciRegistry) -> dict[str, Any]:
    """The dockerconfigjson document of the push credentials."""
    user, password = PUSHER
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"auths": {reg.host: {"auth": token}}}


@pytest.fixture
def push_secrets(cluster: Cluster, namespace: str, tmp_path: Path) -> str:
    """``namespace``, in the chart's rbac.pushSecretNamespaces: the operator (the chart's
    ServiceAccount, ``tests/cluster/chart.py``) may read the push Secret there."""
    chart.read_push_secrets(cluster, namespace, tmp_path / "helm")
    return namespace


def recipe(
    namespace: str, name: str, oci: tuple[OciRegistry, str], index: str, *pip: str
) -> dict[str, Any]:
    """A baseImage + pip Environment pushing to the registry with a push Secret (in a
    namespace of ``push_secrets``)."""
    reg, base = oci
    k8s.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "push", "namespace": namespace},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {
                ".dockerconfigjson": base64.b64encode(json.dumps(push_auth(reg)).encode()).decode()
            },
        }
    )
    body = environment(
        name,
        namespace,
        baseImage=base,
        pip=list(pip),
        pipIndexUrl=index,
        registry={"repository": f"{reg.host}/envs", "pushSecret": "push", "insecure": True},
    )
    k8s.create(body)
    return body


def settled(namespace: str, name: str) -> dict[str, Any]:
    return wait_status(
        k8s.ENVIRONMENTS,
        namespace,
        name,
        lambda s: s.get("phase") in ("Ready", "Failed"),
        BUILD_TIMEOUT,
    )


def build_pod(namespace: str, job: str) -> dict[str, Any]:
    pods = k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={job}")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]  # backoffLimit 0: no retry
    return dict(pods[0])


def pulled_from_registry(cluster: Cluster, namespace: str, pod: str, image: str) -> None:
    """The kubelet's own Event: it pulled ``image`` (through containerd, from the registry;
    no image of that name was on the node before)."""

    def pulled() -> bool:
        return any(
            e.get("reason") == "Pulled" and f'Successfully pulled image "{image}"' in e["message"]
            for e in k8s.events_of(namespace, pod)
        )

    cluster.wait_for(f"the kubelet's Pulled event for {image}", pulled, timeout=60)


def explain_env(cluster: Cluster, namespace: str, name: str) -> str:
    return "\n".join(
        [
            cluster.kubectl("get", "env", name, "-n", namespace, "-o", "yaml", check=False),
            cluster.kubectl("get", "jobs,pods", "-n", namespace, "-o", "wide", check=False),
            cluster.kubectl("logs", "-n", namespace, "-l", "app.kubernetes.io/component="
                            "environment-build", "--all-containers", check=False)[-3000:],
            cluster.kubectl("get", "events", "-n", namespace, check=False)[-3000:],
        ]
    )  # fmt: skip


# -- the tests ------------------------------------------------------------------------------


def test_a_pip_environment_is_built_on_the_node_and_a_run_uses_it(
    cluster: Cluster,
    push_secrets: str,
    only_real_node: RealNode,
    oci: tuple[OciRegistry, str],
    pip_index: str,
) -> None:
    node, (reg, base) = only_real_node, oci
    ns = push_secrets
    started = time.monotonic()
    recipe(ns, "built", oci, pip_index, f"{PACKAGE}=={VERSION}")
    env = settled(ns, "built")
    st = env["status"]
    print(
        f"\n[node] baseImage + pip Environment: {st['phase']} in {time.monotonic() - started:.1f}s"
    )
    assert st["phase"] == "Ready", explain_env(cluster, ns, "built")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Built", ready  # by its Job, not found there before

    # the build ran on the real node, in the base image, as the non-root build user; Ready
    # comes with the push, so the builder may still be exiting
    wait_for(
        "the builder to exit",
        lambda: "terminated" in container(build_pod(ns, st["buildJob"]), "build")["state"],
        timeout=60,
    )
    pod = build_pod(ns, st["buildJob"])
    assert pod["spec"]["nodeName"] == node.name, pod["spec"].get("nodeName")
    build = container(pod, "build")
    assert build["state"]["terminated"]["exitCode"] == 0, build
    assert build["image"] == base, build
    pulled_from_registry(cluster, ns, pod["metadata"]["name"], base)  # not the imported copy
    init = container(pod, "torchyard-init", init=True)
    assert init["image"] == node.images["torchyard"].ref
    text = logs(cluster, ns, pod["metadata"]["name"], "build")
    assert f"[envbuild] base {base}, target {reg.host}/envs:" in text, text
    assert f"uid {BUILD_USER}\n" in text, text
    assert f"Successfully installed {PACKAGE}-{VERSION}" in text, text  # from our index
    assert f"--index-url={pip_index}" in text, text

    # the image it pushed is in the registry under the content hash, and Ready names it
    client = envbuild.Registry(reg.host, push_auth(reg), insecure=True)
    tag = environments.image_tag(st["hash"])
    digest = client.manifest_digest("envs", tag)
    assert digest is not None and st["image"] == f"{reg.host}/envs@{digest}", st
    assert f"[envbuild] pushed {st['image']}" in text
    manifest, _, _ = client.manifest("envs", tag)
    base_manifest, _, _ = client.manifest("python", base.rsplit(":", 1)[1])
    assert manifest["layers"][:-1] == base_manifest["layers"]  # base layers as they were

    # a TrainingRun in that Environment: containerd pulls the built image anonymously
    p = PACKAGE
    script = (
        f"import importlib.metadata as m, shutil, {p}\n"
        f"print('found', {p}.__name__, m.version('{p}'), {p}.song(), 'at', {p}.__file__)\n"
        f"print('script', shutil.which('{p}'))\n"
    )
    run = (
        TrainingRunBuilder("uses-built", ns)
        .environment("built")
        .command("python", "-c", script)
        .nodes(1)
        .procs(1)
        .pool(node.pool)
        .with_("spec.resources", {"cpu": "100m", "memory": "256Mi"})
        .with_("spec.runAsUser", 1000)
        .obj()
    )
    started = time.monotonic()
    k8s.create(run)
    done = finished(ns, "uses-built", timeout=240)
    elapsed = time.monotonic() - started
    print(f"[node] TrainingRun in the built image: {done['status']['phase']} in {elapsed:.1f}s")
    assert done["status"]["phase"] == "Succeeded", explain(cluster, ns, "uses-built")
    pods = run_pods(ns, "uses-built")
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == node.name
    trainer = container(pods[0], "trainer")
    assert trainer["imageID"] == st["image"], trainer  # the built image, by its digest
    pulled_from_registry(cluster, ns, pods[0]["metadata"]["name"], st["image"])
    out = logs(cluster, ns, pods[0]["metadata"]["name"])
    found = [line for line in out.splitlines() if f"found {PACKAGE} " in line]
    assert found, out
    # installed in the image's own layer, under the builder's prefix (not the base's Python)
    assert f"found {PACKAGE} {VERSION} tweet at {envbuild.PREFIX}/" in found[0], out
    assert f"script {envbuild.PREFIX}/" in out, out  # its console script is on PATH


def test_a_package_missing_from_the_index_fails_the_build_with_pips_error(
    cluster: Cluster,
    push_secrets: str,
    only_real_node: RealNode,
    oci: tuple[OciRegistry, str],
    pip_index: str,
) -> None:
    node, (reg, _) = only_real_node, oci
    ns, missing = push_secrets, "no-such-birdsong"
    recipe(ns, "missing", oci, pip_index, f"{missing}==1.0")
    env = settled(ns, "missing")
    st = env["status"]
    assert st["phase"] == "Failed", explain_env(cluster, ns, "missing")
    assert "pip install failed (exit code 1)" in st["message"], st
    assert f"No matching distribution found for {missing}==1.0" in st["message"], st
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "BuildFailed", ready

    # one Job, one Pod that ran on the real node and failed: no retry, no second build
    jobs = k8s.list_(k8s.JOBS, ns)
    assert [j["metadata"]["name"] for j in jobs] == [st["buildJob"]]
    assert jobs[0]["status"].get("failed") == 1 and not jobs[0]["status"].get("succeeded")
    pod = build_pod(ns, st["buildJob"])
    assert pod["spec"]["nodeName"] == node.name
    term = container(pod, "build")["state"]["terminated"]
    assert term["exitCode"] == 1, term
    # the kubelet kept the builder's termination message: the status quotes it
    assert missing in json.loads(term["message"])["error"]
    client = envbuild.Registry(reg.host, push_auth(reg), insecure=True)
    assert client.manifest_digest("envs", environments.image_tag(st["hash"])) is None

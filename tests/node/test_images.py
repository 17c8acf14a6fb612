"""The images the real node runs, made on this machine: the project's own image built from
``images/operator/Dockerfile`` with buildah, and the CPU PyTorch training image.

Every Pod here runs on the real node under the restricted Pod Security profile that
torchyard's own Pods use (non-root, no capabilities, no privilege escalation, RuntimeDefault
seccomp, read-only root file system), so a test passes only if the image works as one of
ours would. The images are made by ``tests/cluster/images.py`` and
``tests/cluster/buildah.py`` (cached by their inputs); the node by ``tests/cluster/realnode.py``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import textwrap
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torchyard
from tests.cluster import buildah, images
from tests.cluster.realnode import RealNode
from tests.node.helpers import Pods, terminated
from tests.node.test_real_node import on_real_node

pytestmark = pytest.mark.node

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "operator" / "torchyard" / "launch" / "main.py"
INSTALLED = "/opt/torchyard/main.py"

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def restricted_pod(
    pods: Pods, name: str, containers: list[dict[str, Any]], **spec: Any
) -> dict[str, Any]:
    """A Pod on the real node whose containers all run under the restricted profile."""
    manifest = pods.manifest(name, "")
    manifest["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        **spec.pop("securityContext", {}),
    }
    for container in [*containers, *spec.get("initContainers", [])]:
        container.setdefault("imagePullPolicy", "Never")
        container["securityContext"] = {**RESTRICTED, **container.get("securityContext", {})}
    manifest["spec"]["containers"] = containers
    manifest["spec"].update(spec)
    return manifest


def logs(pods: Pods, pod: str, container: str) -> str:
    return pods.cluster.kubectl("logs", "-n", pods.namespace, pod, "-c", container)


CHECK = textwrap.dedent(
    """\
    import hashlib, json, os, shutil
    import huggingface_hub, torchyard.inputs.hf, torchyard.launch.main
    def sha(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({
        "uid": os.getuid(),
        "installed": sha(os.environ["INSTALLED"]),
        "packaged": sha(torchyard.launch.main.__file__),
        "entrypoint": shutil.which("torchyard"),
        "huggingface_hub": huggingface_hub.__version__,
    }))
    """
)


def test_the_torchyard_image_runs_as_its_non_root_user_with_cli_and_launcher(
    pods: Pods, real_node: RealNode
) -> None:
    image = real_node.images["torchyard"].ref
    assert image.startswith("torchyard.local/torchyard:")
    launcher = {"name": "launcher", "mountPath": "/opt/torchyard"}
    install = {
        "name": "install",
        "image": image,
        # the installed launcher, copied into a shared volume by the image's own python
        "command": [
            "python3",
            "-c",
            "import shutil, sys, torchyard.launch.main as m;"
            " shutil.copyfile(m.__file__, sys.argv[1])",
            INSTALLED,
        ],
        "volumeMounts": [launcher],
    }
    version = {"name": "version", "image": image, "args": ["--version"]}  # the ENTRYPOINT
    check = {
        "name": "check",
        "image": image,
        "command": ["python3", "-c", CHECK],
        "env": [{"name": "INSTALLED", "value": INSTALLED}],
        "volumeMounts": [{**launcher, "readOnly": True}],
    }
    pods.create(
        restricted_pod(
            pods,
            "torchyard",
            [version, check],
            initContainers=[install],
            volumes=[{"name": "launcher", "emptyDir": {}}],
        )
    )
    pod = pods.finished("torchyard")
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("torchyard")
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert {s["image"] for s in statuses.values()} == {image}
    assert logs(pods, "torchyard", "version").strip() == f"torchyard {torchyard.__version__}"
    seen = json.loads(logs(pods, "torchyard", "check"))
    # no runAsUser in the Pod: the kubelet ran the image's own USER (and runAsNonRoot held).
    # Its group is not applied: the kubelet hands the runtime the image's uid only
    # (kubernetes/kubernetes#61967), so the chart sets runAsGroup itself.
    assert seen["uid"] == 65532
    # the launcher copied out of the image is this tree's, from the installed package
    ours = hashlib.sha256(LAUNCHER.read_bytes()).hexdigest()
    assert seen["installed"] == seen["packaged"] == ours
    assert seen["entrypoint"] == "/usr/local/bin/torchyard"
    # the fetch Job's hf:// client, at the version the lock pins (and the tests ran with)
    assert seen["huggingface_hub"] == importlib.metadata.version("huggingface_hub")


WORKER = textwrap.dedent(
    """\
    import json, os, socket, sys
    import torch, torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=os.environ["INIT_METHOD"], rank=rank, world_size=world
    )
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(json.dumps({"rank": rank, "world": dist.get_world_size(), "sum": value.item(),
                      "backend": dist.get_backend(), "torch": torch.__version__,
                      "uid": os.getuid(), "host": socket.gethostname()}), flush=True)
    dist.destroy_process_group()
    """
)

ALL_REDUCE = textwrap.dedent(
    """\
    import os, socket, subprocess, sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = int(os.environ["WORLD"])
    env = dict(os.environ, WORLD_SIZE=str(world), INIT_METHOD=f"tcp://127.0.0.1:{port}")
    procs = [
        subprocess.Popen([sys.executable, "-c", os.environ["WORKER"]], env=dict(env, RANK=str(r)))
        for r in range(world)
    ]
    sys.exit(max(p.wait(timeout=120) for p in procs))
    """
)


def test_the_training_image_runs_a_two_process_gloo_all_reduce(
    pods: Pods, real_node: RealNode
) -> None:
    world = 2
    env = {"WORLD": str(world), "WORKER": WORKER}
    main = {
        "name": "train",
        "image": real_node.images["pytorch"].ref,
        "command": ["python3", "-c", ALL_REDUCE],
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    pods.create(restricted_pod(pods, "gloo", [main], securityContext={"runAsUser": 1000}))
    pod = pods.finished("gloo", timeout=180)
    on_real_node(pod, real_node)
    assert pod["status"]["phase"] == "Succeeded", pods.explain("gloo")
    lines = [json.loads(line) for line in pods.logs("gloo").splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == list(range(world))
    for line in lines:
        assert line["sum"] == sum(rank + 1 for rank in range(world))
        assert (line["world"], line["backend"], line["uid"]) == (world, "gloo", 1000)
        assert line["host"] == "gloo"  # inside the Pod, not on the host
        assert line["torch"]


EXAMPLES = {
    # name: (files, command after `python3 -m torch.distributed.run ...`, a line every rank prints)
    "ddp": (["ddp/train.py"], ["train.py", "--steps", "30"], "rank {rank}/2: loss"),
    "birds": (
        ["birds/pytorch_train.py", "birds/birds_data.py"],
        ["pytorch_train.py", "--num_epochs", "1"],
        "param-checksum rank {rank} ",
    ),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_examples_run_unchanged_in_the_training_image(
    pods: Pods, real_node: RealNode, example: str
) -> None:
    """The examples, as they are in the repository, with 2 processes under torchrun
    (``torch.distributed.run`` with its default options, which Debian's torch 1.13 needs
    the image's backported fix for under Python 3.11), gloo, in a Pod of the training
    image. (The birds example's ONNX export is left out: its ``dynamo=False`` argument is
    torch 2's.)"""
    files, command, expected = EXAMPLES[example]
    data = {Path(f).name: (REPO / "examples" / f).read_text() for f in files}
    pods.post(
        "configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": example}, "data": data},
    )
    run = ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    main = {
        "name": "train",
        "image": real_node.images["pytorch"].ref,
        "command": [*run, *command, "--output_dir", "/work/outputs"],
        "workingDir": "/src",
        "volumeMounts": [
            {"name": "src", "mountPath": "/src", "readOnly": True},
            {"name": "work", "mountPath": "/work"},
            {"name": "tmp", "mountPath": "/tmp"},  # torchrun's own files (read-only root)
        ],
        "env": [{"name": "HOME", "value": "/work"}, {"name": "OMP_NUM_THREADS", "value": "1"}],
        "resources": {"limits": {"memory": "3Gi"}},
    }
    volumes = [
        {"name": "src", "configMap": {"name": example}},
        {"name": "work", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    pods.create(
        restricted_pod(pods, example, [main], securityContext={"runAsUser": 1000}, volumes=volumes)
    )
    pod = pods.finished(example, timeout=540)  # under pytest's 600 s per test
    on_real_node(pod, real_node)
    out = pods.logs(example)
    assert pod["status"]["phase"] == "Succeeded", f"{out[-3000:]}\n{pods.explain(example)}"
    assert terminated(pod)["exitCode"] == 0
    for rank in range(2):
        assert expected.format(rank=rank) in out, out[-3000:]


def test_a_warm_ensure_makes_and_builds_nothing(
    real_node: RealNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The images are cached by their inputs: asking again finds the same keys and
    archives, and starts no process (no debootstrap, no tar, no buildah)."""
    made = {name: real_node.images[name] for name in ("python", "pytorch")}
    # the torchyard image's inputs are this tree's files: asked once more first, in case
    # they were edited since the session started (then this call builds, legitimately)
    made["torchyard"] = buildah.ensure_project_image(base=made["python"])
    before = {name: image.archive.stat() for name, image in made.items()}

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a cached image started a process: {args}")

    refuse = types.SimpleNamespace(
        run=no_process, Popen=no_process, PIPE=subprocess.PIPE, STDOUT=subprocess.STDOUT
    )
    monkeypatch.setattr(images, "subprocess", refuse)
    monkeypatch.setattr(buildah, "subprocess", refuse)
    timings: dict[str, float] = {}
    again: dict[str, images.Image] = {}
    ensures: list[tuple[str, Callable[[], images.Image]]] = [
        ("python", lambda: images.ensure_python_image(log=False)),
        ("pytorch", lambda: images.ensure_pytorch_image(log=False)),
        ("torchyard", lambda: buildah.ensure_project_image(base=again["python"], log=False)),
    ]
    for name, ensure in ensures:
        started = time.monotonic()
        again[name] = ensure()
        timings[name] = time.monotonic() - started
    print(f"\n[node] warm ensure: {', '.join(f'{k} {v:.2f}s' for k, v in timings.items())}")
    assert again == made
    for name, image in again.items():
        after = image.archive.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before[name].st_ino, before[name].st_mtime_ns)

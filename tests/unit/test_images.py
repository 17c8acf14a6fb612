"""The Dockerfiles, checked without a Docker engine: non-root users, pinned bases, the
files they copy exist, and the operator image is built in two stages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchyard.planning import pods

REPO = Path(__file__).resolve().parents[2]
IMAGES = sorted((REPO / "images").glob("*/Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_three_images_are_there() -> None:
    assert [p.parent.name for p in IMAGES] == ["operator", "pytorch-cpu", "pytorch-cuda"]


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.parent.name)
def test_runs_as_non_root_on_a_pinned_base(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0].isdigit(), "a numeric user, so runAsNonRoot can verify it"
    bases = [arg for op, arg in steps if op == "ARG" and arg.startswith("PYTHON_IMAGE=")]
    assert bases, "the base image is an ARG"
    assert re.fullmatch(r"PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+", bases[0]), bases[0]
    for op, arg in steps:
        if op == "COPY" and not arg.startswith("--from"):
            *sources, _dest = arg.split()
            for source in sources:
                assert list(REPO.glob(source)), f"{dockerfile}: COPY {source}"


def test_the_operator_image_is_multi_stage_and_has_no_build_tools_left() -> None:
    steps = instructions(REPO / "images" / "operator" / "Dockerfile")
    froms = [arg for op, arg in steps if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS wheels")
    runtime = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][1] :]
    assert not any(op == "COPY" and "operator" in arg for op, arg in runtime)
    assert ("ENTRYPOINT", '["torchyard"]') in runtime


def test_the_cpu_image_takes_its_torch_index_as_a_build_argument_with_the_public_default() -> None:
    steps = instructions(REPO / "images" / "pytorch-cpu" / "Dockerfile")
    args = [arg for op, arg in steps if op == "ARG"]
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in args
    froms = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    declared = [i for i, (op, arg) in enumerate(steps) if op == "ARG" and "TORCH_INDEX" in arg]
    assert declared[0] > froms[-1], "declared inside the stage, so RUN sees it"
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert '--index-url "${TORCH_INDEX_URL}"' in runs
    assert "download.pytorch.org" not in runs


@pytest.mark.parametrize("image", ["pytorch-cpu", "pytorch-cuda"])
def test_a_curated_image_copies_every_shipped_module_into_one_package_folder(image: str) -> None:
    """The launcher imports the modules shipped beside it: the image has them all, at their
    paths in one ``torchyard/`` package folder, as a node Pod's ConfigMap volume does."""
    steps = instructions(REPO / "images" / image / "Dockerfile")
    copies = [arg.split() for op, arg in steps if op == "COPY" and "operator/" in arg]
    root = "/opt/torchyard/lib/torchyard/"
    copied = set()
    for *sources, dest in copies:
        assert dest.startswith(root), dest
        for source in sources:
            for path in REPO.glob(source):
                copied.add(dest[len(root) :] + path.name)
    assert copied == set(pods.shipped_files())

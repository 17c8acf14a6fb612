"""The release's one version and its images, without building: the chart's version and
appVersion are torchyard's version, the chart's defaults name exactly the images the
release builds, the release workflow runs the Makefile's steps on a tag, and the pieces
``make images`` writes (provenance, the digest of an archive) say what was built.

Building and pushing for real: ``tests/node/test_release_on_node.py``.
"""

from __future__ import annotations

import json
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import yaml

import torchyard
from tests.cluster import buildah, release

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def test_the_chart_version_and_app_version_are_torchyards_version() -> None:
    assert release.chart_versions() == (torchyard.__version__, torchyard.__version__)
    assert release.check_chart_version() == torchyard.__version__


def test_a_chart_of_another_version_is_refused(tmp_path: Path) -> None:
    meta = yaml.safe_load((release.CHART / "Chart.yaml").read_text())
    for field in ("version", "appVersion"):
        (tmp_path / "Chart.yaml").write_text(yaml.safe_dump({**meta, field: "9.9.9"}))
        with pytest.raises(SystemExit, match="must both be torchyard's version"):
            release.check_chart_version(tmp_path)


def test_the_charts_default_images_are_exactly_the_ones_the_release_builds() -> None:
    values = yaml.safe_load((release.CHART / "values.yaml").read_text())
    images = {i.name: i for i in release.release_images()}
    assert set(images) == set(buildah.DOCKERFILES)
    operator = images["torchyard"]
    # the operator image: the repository, and the tag left to the appVersion
    assert values["image"]["repository"] == f"{release.DEFAULT_REGISTRY}/{operator.repository}"
    assert values["image"]["tag"] == "" and values["image"]["digest"] == ""
    assert operator.tag == torchyard.__version__
    assert values["operator"]["initImage"] == ""  # the operator image
    curated = sorted(e["image"] for e in values["environments"]["curated"])
    assert curated == sorted(images[n].ref() for n in ("pytorch-cpu", "pytorch-cuda"))
    assert values["imageRegistry"] == ""


def test_curated_tags_follow_the_torch_their_dockerfile_pins() -> None:
    for name in ("pytorch-cpu", "pytorch-cuda"):
        text = (REPO / buildah.DOCKERFILES[name]).read_text()
        minor = release.torch_minor(text)
        [image] = [i for i in release.release_images() if i.name == name]
        assert image.tag.startswith(f"{minor}-"), (image.tag, minor)
        assert f"torch=={minor}." in text


def test_the_cuda_tag_names_the_cuda_that_the_pinned_torch_brings() -> None:
    """PyPI's torch wheel pulls its CUDA runtime in as a dependency (nvidia-cuda-runtime):
    the lock, resolved with the same torch, says which; the tag says the same major."""
    lock = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        name, sep, version = line.split(";")[0].strip().partition("==")
        if sep and not name.startswith("#"):
            lock[name.lower()] = version.strip()
    dockerfile = (REPO / buildah.DOCKERFILES["pytorch-cuda"]).read_text()
    assert f"torch=={lock['torch']} " in dockerfile
    major = lock["nvidia-cuda-runtime"].split(".")[0]
    [image] = [i for i in release.release_images() if i.name == "pytorch-cuda"]
    assert image.tag.endswith(f"-cuda{major}"), (image.tag, lock["nvidia-cuda-runtime"])
    assert f"CUDA {major}" in dockerfile


@pytest.mark.parametrize(
    "text",
    ["RUN pip install torch", "RUN pip install torch==2.1.0 torch==2.2.0", "RUN pip install x"],
    ids=["unpinned", "two pins", "none"],
)
def test_a_dockerfile_without_one_torch_pin_is_refused(text: str) -> None:
    with pytest.raises(SystemExit, match=r"one torch==X\.Y\.Z pin"):
        release.torch_minor(text)


def _archive(path: Path, digest: str) -> Path:
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": digest}]}).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, BytesIO(index))
    return path


def test_provenance_names_the_image_its_digest_dockerfile_and_commit(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    assert release.archive_digest(_archive(tmp_path / "image.tar", digest)) == digest
    [image] = [i for i in release.release_images() if i.name == "torchyard"]
    statement = release.provenance(image, digest, "torchyard.local/python:0123456789ab")
    [subject] = statement["subject"]
    assert subject == {
        "name": f"ghcr.io/torchyard/torchyard:{torchyard.__version__}",
        "digest": {"sha256": "ab" * 32},
    }
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"] == {
        "dockerfile": "images/operator/Dockerfile",
        "version": torchyard.__version__,
    }
    commit, base = build["resolvedDependencies"]
    assert len(commit["digest"]["gitCommit"]) == 40
    assert base == {"uri": "torchyard.local/python:0123456789ab"}


def test_the_release_workflow_runs_the_makefiles_steps_on_a_version_tag() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on") or workflow.get(True)  # YAML 1.1 reads `on` as true
    assert triggers == {"push": {"tags": ["v*"]}}
    runs = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    script = "\n".join(runs)
    assert "make images" in script and "PUSH=" in script
    assert "make chart" in script
    # the tag must be the one version: the workflow checks it before building
    assert "tests.cluster.release version" in script


def test_the_version_step_prints_torchyards_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert release.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == torchyard.__version__

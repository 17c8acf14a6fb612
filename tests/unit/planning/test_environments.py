"""Environment builds: the content hash and the build Job, built purely from the spec."""

from __future__ import annotations

from typing import Any

from torchyard import api
from torchyard.planning import environments


def env(name: str = "e", **spec: Any) -> api.Environment:
    base = {
        "baseImage": "python:3.11-slim",
        "pip": ["torch==2.15.0"],
        "registry": {"repository": "registry.local:5000/envs"},
    }
    return api.parse_environment(
        {
            "kind": "Environment",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {**base, **spec},
        }
    )


def test_hash_ignores_the_name_and_insignificant_whitespace() -> None:
    a = environments.content_hash(env("a"))
    b = environments.content_hash(env("b", pip=[" torch==2.15.0 "]))
    assert a == b and a.startswith("sha256:")


def test_hash_changes_with_every_build_input() -> None:
    base = environments.content_hash(env())
    for change in (
        {"baseImage": "python:3.12-slim"},
        {"pip": ["torch==2.14.0"]},
        {"conda": "dependencies: [python=3.11]"},
        {"env": {"A": "1"}},
    ):
        assert environments.content_hash(env(**change)) != base, change


def test_one_job_per_hash_and_repository() -> None:
    h = environments.content_hash(env())
    assert environments.job_name(env("a"), h) == environments.job_name(env("b"), h)
    other = env(registry={"repository": "elsewhere/envs"})
    assert environments.job_name(other, h) != environments.job_name(env(), h)


def test_build_job_runs_unprivileged_in_the_base_image() -> None:
    e = env(
        env={"OMP_NUM_THREADS": "4"},
        registry={"repository": "registry.local:5000/envs", "pushSecret": "push"},
    )
    h = environments.content_hash(e)
    job = environments.build_job(e, h)
    pod = job["spec"]["template"]["spec"]
    build = pod["containers"][0]
    assert build["image"] == "python:3.11-slim"
    assert build["command"][:2] == ["python3", "/torchyard/envbuild.py"]
    assert ["--target", f"registry.local:5000/envs:{h.replace(':', '-')}"] == build["command"][4:6]
    assert "--env" in build["command"] and "OMP_NUM_THREADS=4" in build["command"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert build["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "TORCHYARD_REGISTRY_AUTH", "value": "/torchyard/auth/config.json"} in build[
        "env"
    ]
    assert job["spec"]["backoffLimit"] == 0


def test_a_dockerfile_is_built_by_rootless_buildkit() -> None:
    e = api.parse_environment(
        {
            "kind": "Environment",
            "metadata": {"name": "d", "namespace": "n"},
            "spec": {
                "dockerfile": "FROM python:3.11\nRUN pip install x\n",
                "registry": {"repository": "reg:5000/envs", "insecure": True},
            },
        }
    )
    h = environments.content_hash(e)
    job = environments.build_job(e, h)
    build = job["spec"]["template"]["spec"]["containers"][0]
    assert build["image"].startswith("moby/buildkit:") and build["image"].endswith("-rootless")
    assert (
        f"type=image,name=reg:5000/envs:{environments.image_tag(h)},push=true,"
        "registry.insecure=true" in build["args"]
    )
    assert build["securityContext"]["runAsUser"] == 1000
    recipe = environments.recipe_configmap(e, h)
    assert recipe is not None and recipe["data"]["Dockerfile"].startswith("FROM python:3.11")
    other = environments.content_hash(
        api.parse_environment(
            {
                "kind": "Environment",
                "metadata": {"name": "d"},
                "spec": {"dockerfile": "FROM python:3.12", "registry": {"repository": "r"}},
            }
        )
    )
    assert other != h


def test_conda_without_a_conda_tool_in_the_base_image_is_a_clear_error(tmp_path: Any) -> None:
    import pytest

    from torchyard import envbuild

    recipe = tmp_path / "environment.yml"
    recipe.write_text("dependencies: [python=3.11]\n")
    with pytest.raises(envbuild.BuildError, match="has no conda, mamba or micromamba"):
        envbuild.install(
            str(tmp_path / "prefix"), [], str(recipe), [], path=str(tmp_path)
        )  # a PATH with no conda tool on it

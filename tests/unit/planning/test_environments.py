"""Environment builds: the content hash and the build Job, built purely from the spec."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

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


def test_a_pip_index_reaches_pip_and_a_plain_http_one_is_trusted_by_host() -> None:
    e = env(pipIndexUrl="http://10.1.2.3:8081/simple")
    command = environments.build_job(e, environments.content_hash(e))["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    # one word each: the builder's argparse would read a bare "--index-url" as its own option
    assert "--pip-arg=--index-url=http://10.1.2.3:8081/simple" in command
    assert "--pip-arg=--trusted-host=10.1.2.3:8081" in command
    https = env(pipIndexUrl="https://pypi.internal/simple")
    args = environments.pip_args(https)
    assert args == ["--index-url=https://pypi.internal/simple"]  # TLS: nothing to trust
    assert environments.pip_args(env()) == []


def test_the_pip_index_is_a_build_input_but_leaves_other_hashes_alone() -> None:
    plain = environments.content_hash(env())
    mirrored = environments.content_hash(env(pipIndexUrl="http://mirror/simple"))
    other = environments.content_hash(env(pipIndexUrl="http://other/simple"))
    assert len({plain, mirrored, other}) == 3
    # an Environment without an index keeps the hash (and image) it had before the field
    before = (
        b'{"baseImage":"python:3.11-slim","builder":"1","conda":"","dockerfile":"","env":{},'
        b'"pip":["torch==2.15.0"]}'
    )
    assert plain == "sha256:" + hashlib.sha256(before).hexdigest()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"pipIndexUrl": "ftp://mirror/simple"}, "should match pattern"),
        ({"pipIndexUrl": "http://mirror/simple --pre"}, "should match pattern"),
        (
            {"baseImage": None, "image": "python:3.11", "pip": [], "pipIndexUrl": "http://m/s"},
            "pipIndexUrl needs baseImage",
        ),
    ],
)
def test_a_bad_pip_index_is_refused(spec: dict[str, Any], says: str) -> None:
    body = {
        "baseImage": "python:3.11-slim",
        "registry": {"repository": "registry.local:5000/envs"},
        **spec,
    }
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(api.InvalidSpec, match=says):
        api.parse_environment({"kind": "Environment", "metadata": {"name": "e"}, "spec": body})

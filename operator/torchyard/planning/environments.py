"""Environment builds: the content hash of the build inputs and the build Job.

The hash covers what makes the image (base image, pip requirements and index, conda text,
baked variables, the builder's format version), not the Environment's name, so two
Environments with the same recipe share one image and one build Job (one per hash and
repository). The Job runs the standard-library builder (``torchyard.envbuild``) **in
the base image**, unprivileged. Pure builders; called by the controller and the CLI.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from typing import Any

from torchyard.api import Environment, wire
from torchyard.envbuild import HASH_LABEL, PREFIX
from torchyard.launch.contract import TORCHYARD_INSECURE_REGISTRIES, TORCHYARD_REGISTRY_AUTH
from torchyard.planning.pods import INIT_PYTHON, Settings

BUILDKIT_IMAGE = "moby/buildkit:v0.23.2-rootless"
BUILDER_FORMAT = "1"  # bump when the layer layout changes: every hash changes with it
ENVBUILD_PATH = "/torchyard/envbuild.py"


def content_hash(env: Environment) -> str:
    """``sha256:<hex>`` of the normalised build inputs."""
    spec = env.spec
    inputs = {
        "builder": BUILDER_FORMAT,
        "baseImage": (spec.base_image or "").strip(),
        "pip": [r.strip() for r in spec.pip if r.strip()],
        "conda": "\n".join(line.rstrip() for line in (spec.conda or "").strip().splitlines()),
        "env": dict(sorted(spec.env.items())),
        "dockerfile": (spec.dockerfile or "").strip(),
    }
    if spec.pip_index_url:  # only when set: the hashes of Environments without one stay
        inputs["pipIndexUrl"] = spec.pip_index_url.strip()
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def pip_args(env: Environment) -> list[str]:
    """pip's options for ``spec.pipIndexUrl``: the index, and a plain-http index's host
    trusted (pip ignores a plain-http index otherwise; the spec asked for this one)."""
    url = env.spec.pip_index_url
    if not url:
        return []
    args = [f"--index-url={url}"]
    parts = urllib.parse.urlsplit(url)
    if url.lower().startswith("http://") and parts.hostname:
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        args.append(f"--trusted-host={host}")
    return args


def image_tag(hash_: str) -> str:
    return hash_.replace(":", "-")


def target(env: Environment, hash_: str) -> str:
    """Where the built image goes: ``<repository>:<sha256-hex>``."""
    assert env.spec.registry is not None
    return f"{env.spec.registry.repository.rstrip('/')}:{image_tag(hash_)}"


def job_name(env: Environment, hash_: str) -> str:
    """One Job per hash and repository (two Environments with one recipe share it)."""
    assert env.spec.registry is not None
    key = f"{hash_}|{env.spec.registry.repository}".encode()
    return f"envbuild-{hashlib.sha256(key).hexdigest()[:16]}"


def restricted() -> dict[str, Any]:
    """A container's securityContext under Pod Security "restricted" (a non-root image)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def build_job(env: Environment, hash_: str, settings: Settings | None = None) -> dict[str, Any]:
    """The build Job: the builder runs in the base image as a non-root user."""
    if env.spec.dockerfile is not None:
        return buildkit_job(env, hash_)
    settings = settings or Settings()
    spec = env.spec
    assert spec.base_image is not None and spec.registry is not None
    args: list[str] = [
        "--base",
        spec.base_image,
        "--target",
        target(env, hash_),
        "--label",
        f"{HASH_LABEL}={hash_}",
    ]
    for req in spec.pip:
        args += ["--pip", req]
    # "--pip-arg=--x" in one word: a separate "--x" would be read as the builder's option
    args += [f"--pip-arg={arg}" for arg in pip_args(env)]
    for key, value in sorted(spec.env.items()):
        args += ["--env", f"{key}={value}"]
    env_vars: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "PIP_CACHE_DIR", "value": "/tmp/pip"},
    ]
    if spec.registry.insecure:
        host = spec.registry.repository.split("/", 1)[0]
        env_vars.append({"name": TORCHYARD_INSECURE_REGISTRIES, "value": host})
    mounts: list[dict[str, Any]] = [
        {"name": "tools", "mountPath": "/torchyard"},
        {"name": "prefix", "mountPath": PREFIX},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "tools", "emptyDir": {}},
        {"name": "prefix", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if spec.conda is not None:
        args += ["--conda-file", "/torchyard/recipe/environment.yml"]
        volumes.append({"name": "recipe", "configMap": {"name": job_name(env, hash_)}})
        mounts.append({"name": "recipe", "mountPath": "/torchyard/recipe", "readOnly": True})
    if spec.registry.push_secret:
        volumes.append(_push_secret_volume(spec.registry.push_secret))
        mounts.append({"name": "auth", "mountPath": "/torchyard/auth", "readOnly": True})
        env_vars.append({"name": TORCHYARD_REGISTRY_AUTH, "value": "/torchyard/auth/config.json"})
    return _job(
        env,
        hash_,
        {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "fsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": [
                {
                    "name": "torchyard-init",
                    "image": settings.init_image,
                    "command": [
                        INIT_PYTHON,
                        "-m",
                        "torchyard.envbuild",
                        "--install",
                        ENVBUILD_PATH,
                    ],
                    "volumeMounts": [{"name": "tools", "mountPath": "/torchyard"}],
                    "securityContext": restricted(),
                }
            ],
            "containers": [
                {
                    "name": "build",
                    "image": spec.base_image,
                    "command": [spec.python, ENVBUILD_PATH, *args],
                    "env": env_vars,
                    "volumeMounts": mounts,
                    "securityContext": restricted(),
                }
            ],
            "volumes": volumes,
        },
    )


def _push_secret_volume(secret: str) -> dict[str, Any]:
    """The registry.pushSecret (a dockerconfigjson Secret) as a volume holding config.json."""
    return {
        "name": "auth",
        "secret": {
            "secretName": secret,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
        },
    }


def _labels(hash_: str) -> dict[str, str]:
    return {
        wire.LABEL_ENVIRONMENT_HASH: hash_.removeprefix("sha256:")[:63],
        "app.kubernetes.io/managed-by": "torchyard",
        "app.kubernetes.io/component": "environment-build",
    }


def buildkit_job(env: Environment, hash_: str) -> dict[str, Any]:
    """A ``dockerfile:`` Environment: rootless BuildKit, daemonless, pushing by itself.

    Rootless BuildKit needs Unconfined seccomp and AppArmor (it creates user namespaces),
    so its namespace must allow the Pod Security "privileged" level, although the Pod
    itself runs as user 1000 and is not privileged.
    """
    spec = env.spec
    assert spec.registry is not None
    output = f"type=image,name={target(env, hash_)},push=true"
    if spec.registry.insecure:
        output += ",registry.insecure=true"
    mounts: list[dict[str, Any]] = [
        {"name": "recipe", "mountPath": "/workspace", "readOnly": True},
        {"name": "buildkitd", "mountPath": "/home/user/.local/share/buildkit"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "recipe", "configMap": {"name": job_name(env, hash_)}},
        {"name": "buildkitd", "emptyDir": {}},
    ]
    if spec.registry.push_secret:
        volumes.append(_push_secret_volume(spec.registry.push_secret))
        mounts.append({"name": "auth", "mountPath": "/home/user/.docker", "readOnly": True})
    return _job(
        env,
        hash_,
        {
            "containers": [
                {
                    "name": "build",
                    "image": BUILDKIT_IMAGE,
                    "command": ["buildctl-daemonless.sh"],
                    "args": [
                        "build",
                        "--frontend",
                        "dockerfile.v0",
                        "--local",
                        "context=/workspace",
                        "--local",
                        "dockerfile=/workspace",
                        "--opt",
                        f"label:{HASH_LABEL}={hash_}",
                        "--output",
                        output,
                    ],
                    "env": [
                        {
                            "name": "BUILDKITD_FLAGS",
                            "value": "--oci-worker-no-process-sandbox",
                        }
                    ],
                    "securityContext": {
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "seccompProfile": {"type": "Unconfined"},
                        "appArmorProfile": {"type": "Unconfined"},
                    },
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    )


def _job(env: Environment, hash_: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The Job around a build Pod: no retries, cleaned up a day after it finished; the
    build container's termination message falls back to its log's tail (what a failed
    build says)."""
    for container in pod_spec["containers"]:
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    labels = _labels(hash_)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(env, hash_),
            "namespace": env.metadata.get("namespace", "default"),
            "labels": labels,
        },
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    **pod_spec,
                },
            },
        },
    }


def recipe_configmap(env: Environment, hash_: str) -> dict[str, Any] | None:
    """The conda environment.yml or the Dockerfile the Job mounts (None without either)."""
    if env.spec.conda is None and env.spec.dockerfile is None:
        return None
    data = (
        {"Dockerfile": env.spec.dockerfile}
        if env.spec.dockerfile is not None
        else {"environment.yml": env.spec.conda or ""}
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": job_name(env, hash_),
            "namespace": env.metadata.get("namespace", "default"),
        },
        "data": data,
    }

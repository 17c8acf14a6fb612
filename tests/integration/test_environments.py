"""Environments on the real control plane with a real OCI registry: cache hits need no
Job, a new recipe gets exactly one restricted build Job (shared by Environments with the
same recipe), and a failed build fails the Environment and the runs waiting on it."""

from __future__ import annotations

import json
from typing import Any

from tests.builders import TrainingRunBuilder, environment
from tests.cluster.harness import Cluster
from tests.cluster.registry import OciRegistry
from tests.conftest import InProcessOperator
from tests.integration.helpers import conditions, finish_pod, wait_event, wait_for, wait_status
from tests.integration.test_envbuild import push_base_image
from torchyard import api, k8s
from torchyard.controller import telemetry
from torchyard.planning import environments


def recipe(reg: OciRegistry, *pip: str) -> dict[str, Any]:
    return {
        "baseImage": "python:3.11-slim",
        "pip": list(pip),
        "registry": {"repository": f"{reg.host}/envs", "insecure": True},
    }


def build_jobs(ns: str) -> list[dict[str, Any]]:
    return k8s.list_(k8s.JOBS, ns, label_selector="app.kubernetes.io/component=environment-build")


def running_build_pod(namespace: str) -> str:
    """The name of the (single) build Job's Pod, once KWOK runs it."""
    job = wait_for("the build Job", lambda: build_jobs(namespace))[0]["metadata"]["name"]
    pods = wait_for(
        "the build Pod running",
        lambda: [
            p
            for p in k8s.list_(k8s.PODS, namespace, label_selector=f"job-name={job}")
            if p.get("status", {}).get("phase") == "Running"
        ],
    )
    return str(pods[0]["metadata"]["name"])


def test_an_image_already_in_the_registry_is_ready_without_a_job(
    oci_registry: OciRegistry, operator: InProcessOperator, namespace: str
) -> None:
    body = environment("cached", namespace, **recipe(oci_registry, "torch==2.15.0"))
    hash_ = environments.content_hash(api.parse_environment(body))
    push_base_image(oci_registry, "envs", environments.image_tag(hash_))
    hits = telemetry.CACHE_HITS.value()
    k8s.create(body)
    env = wait_status(k8s.ENVIRONMENTS, namespace, "cached", lambda s: s.get("phase") == "Ready")
    assert env["status"]["hash"] == hash_
    assert env["status"]["image"].startswith(f"{oci_registry.host}/envs@sha256:")
    assert conditions(env)["Ready"]["reason"] == "Cached"
    assert build_jobs(namespace) == []
    # the operator's /metrics counter, counted just after the status write seen above
    wait_for("the cache hit's metric", lambda: telemetry.CACHE_HITS.value() > hits)
    assert telemetry.CACHE_HITS.value() == hits + 1


def test_a_new_recipe_gets_one_restricted_build_job_shared_by_its_twins(
    oci_registry: OciRegistry, operator: InProcessOperator, namespace: str
) -> None:
    for name in ("vision", "vision-copy"):
        k8s.create(environment(name, namespace, **recipe(oci_registry, "pillow", "numpy")))
    for name in ("vision", "vision-copy"):
        wait_status(k8s.ENVIRONMENTS, namespace, name, lambda s: s.get("phase") == "Building")
    jobs = build_jobs(namespace)
    assert len(jobs) == 1
    pod = jobs[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    build = pod["containers"][0]
    assert build["image"] == "python:3.11-slim", "the builder runs in the base image"
    assert build["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert build["command"][2:6] == [
        "--base",
        "python:3.11-slim",
        "--target",
        f"{oci_registry.host}/envs:"
        + environments.image_tag(k8s.get(k8s.ENVIRONMENTS, namespace, "vision")["status"]["hash"]),
    ]


def test_a_failed_build_fails_the_environment_and_its_waiting_runs(
    cluster: Cluster, oci_registry: OciRegistry, operator: InProcessOperator, namespace: str
) -> None:
    k8s.create(environment("broken", namespace, **recipe(oci_registry, "no-such-package")))
    k8s.create(TrainingRunBuilder("waiting", namespace).environment("broken").obj())
    wait_status(k8s.TRAININGRUNS, namespace, "waiting", lambda s: s.get("phase") == "Preparing")
    pod = running_build_pod(namespace)
    failed = telemetry.BUILDS.value(result="failed")
    timed = telemetry.BUILD_SECONDS.count(result="failed")
    error = (
        "pip install failed (exit code 1):\nERROR: Could not find a version that "
        "satisfies the requirement no-such-package"
    )
    finish_pod(cluster, namespace, pod, 1, json.dumps({"error": error}))
    env = wait_status(
        k8s.ENVIRONMENTS, namespace, "broken", lambda s: s.get("phase") == "Failed", timeout=60
    )
    assert env["status"]["message"] == error
    assert "satisfies the requirement no-such-package" in conditions(env)["Ready"]["message"]
    # kstatus: a failed build needs the user (Stalled), it is no longer in progress.
    assert conditions(env)["Stalled"]["status"] == "True"
    assert conditions(env)["Stalled"]["reason"] == "BuildFailed"
    assert conditions(env)["Reconciling"]["status"] == "False"
    # The build metrics: one more failed build, with its duration from the Job. They are
    # counted just after the status write that the wait above saw, so wait for them too.
    wait_for(
        "the failed build's metrics",
        lambda: telemetry.BUILD_SECONDS.count(result="failed") > timed,
    )
    assert telemetry.BUILDS.value(result="failed") == failed + 1
    assert telemetry.BUILD_SECONDS.count(result="failed") == timed + 1
    wait_event(
        namespace,
        "broken",
        "the BuildFailed Warning",
        lambda e: (e["type"], e["reason"]) == ("Warning", "BuildFailed"),
    )
    run = wait_status(k8s.TRAININGRUNS, namespace, "waiting", lambda s: s.get("phase") == "Failed")
    assert run["status"]["failure"]["reason"] == "EnvironmentFailed"
    assert "no-such-package" in run["status"]["failure"]["message"]


def test_a_base_image_without_python_fails_with_advice(
    cluster: Cluster, oci_registry: OciRegistry, operator: InProcessOperator, namespace: str
) -> None:
    spec = recipe(oci_registry, "torch")
    spec["baseImage"] = "busybox:1.37"
    k8s.create(environment("nopython", namespace, **spec))
    pod = running_build_pod(namespace)
    finish_pod(
        cluster,
        namespace,
        pod,
        128,
        'exec: "python3": executable file not found in $PATH',
        reason="StartError",
    )
    env = wait_status(
        k8s.ENVIRONMENTS, namespace, "nopython", lambda s: s.get("phase") == "Failed", timeout=60
    )
    assert env["status"]["message"].startswith(
        "the base image has no python3: the builder runs in the base image"
    )


def test_a_curated_image_in_a_reachable_registry_is_pinned_to_its_digest(
    oci_registry: OciRegistry, operator: InProcessOperator, namespace: str
) -> None:
    image = push_base_image(oci_registry, "curated", "2.15-cpu")
    k8s.create(environment("pinned", namespace, image=image))
    env = wait_status(k8s.ENVIRONMENTS, namespace, "pinned", lambda s: s.get("phase") == "Ready")
    assert env["status"]["image"].startswith(f"{oci_registry.host}/curated@sha256:")
    assert build_jobs(namespace) == []

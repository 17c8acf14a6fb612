"""The inputs step of the reconcile, against the in-memory fake of ``torchyard.k8s``:
an indexed entry admits the run with nothing fetched; a missing one starts the key's one
fetch Job, after taking the least recently used entries that no unfinished run uses out
of the index (and handing them to the Job to delete); a Job that finished without saying
what it fetched fails the run with where to look."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.controller.world import NS, env, reconcile, run, status, world
from torchyard import api, k8s
from torchyard.planning import inputs, names, pods

SHA = "ab" * 32
BIRDS = {"name": "birds", "uri": "https://h/birds.tgz", "sha256": SHA}


def entry(key: str, size: int, last_used: str) -> dict[str, Any]:
    record = {
        "key": key,
        "uri": "https://h/x",
        "revision": SHA,
        "digest": "sha256:d",
        "bytes": size,
    }
    return inputs.entry_config_map(NS, record, size, last_used)


def other_run(name: str, phase: str, uri: str) -> dict[str, Any]:
    body = run({"phase": phase}, {"inputs": [{**BIRDS, "uri": uri}]})
    body["metadata"]["name"] = name
    return body


def key_of(body: dict[str, Any]) -> str:
    return inputs.keys(api.parse_trainingrun(body))["birds"]


def settings(limit: int) -> pods.Settings:
    return pods.Settings(inputs_cache=inputs.CacheSettings(limit_bytes=limit))


def test_an_indexed_entry_admits_the_run_with_nothing_fetched() -> None:
    body = run(spec={"inputs": [BIRDS]})
    key = key_of(body)
    fake = world(body, env(), entry(key, 100, "2026-01-01T10:00:00Z"))
    reconcile(fake)
    assert status(fake)["inputs"][0]["fetchedBytes"] == 0
    assert status(fake)["phase"] != "Preparing"
    assert not fake.list_(k8s.JOBS, NS)
    # its use is recorded: the entry is the most recently used now
    used = fake.get(k8s.CONFIGMAPS, NS, names.input_entry(key))["data"]["lastUsed"]
    assert used == "2026-01-01T12:00:00Z"


def test_a_fetch_evicts_the_least_recently_used_entries_no_unfinished_run_uses() -> None:
    body = run(spec={"inputs": [BIRDS]})
    busy = other_run("busy", "Running", "https://h/busy.tgz")
    done = other_run("done", "Succeeded", "https://h/done.tgz")
    busy_key, done_key = key_of(busy), key_of(done)
    fake = world(
        body,
        env(),
        busy,
        done,
        entry(busy_key, 60, "2026-01-01T01:00:00Z"),  # oldest, but its run goes on
        entry(done_key, 60, "2026-01-01T02:00:00Z"),
        entry("c" * 64, 10, "2026-01-01T03:00:00Z"),
    )
    reconcile(fake, settings=settings(100))
    assert status(fake)["phase"] == "Preparing"
    [job] = fake.list_(k8s.JOBS, NS)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--evict") :] == ["--evict", done_key]
    assert fake.get_or_none(k8s.CONFIGMAPS, NS, names.input_entry(done_key)) is None
    assert fake.get_or_none(k8s.CONFIGMAPS, NS, names.input_entry(busy_key)) is not None
    assert fake.get(k8s.PERSISTENTVOLUMECLAIMS, NS, names.INPUTS_CLAIM)


def test_a_job_that_says_nothing_fails_the_run_with_where_to_look() -> None:
    body = run(
        {"phase": "Preparing", "inputs": [{"name": "birds", "uri": BIRDS["uri"]}]},
        {"inputs": [BIRDS]},
    )
    key = key_of(body)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.input_fetch(key), "namespace": NS},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    fake = world(body, env(), job)
    reconcile(fake)
    failure = status(fake)["failure"]
    assert failure["reason"] == "InputFetchFailed"
    assert failure["message"].startswith(f"input birds ({BIRDS['uri']}): the fetch Job ended")
    assert f"kubectl logs -n {NS} job/{names.input_fetch(key)}" in failure["message"]
    assert json.dumps(status(fake)).count("fetchedBytes") == 0

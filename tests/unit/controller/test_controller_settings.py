"""The operator's options (peering, metrics, namespaces, the default log limit), its work
queue in namespaced mode and the runs-by-phase gauge: no cluster, no Kopf event loop."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
import yaml

from torchyard.controller import handlers, operators, options, telemetry, workqueue

REPO = Path(__file__).resolve().parents[3]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_options_for_peering_metrics_and_namespaces() -> None:
    args = parse("-n", "team-a", "--namespace", "team-b", "--peering-name", "torchyard")
    assert args.namespace == ["team-a", "team-b"]
    assert args.peering_name == "torchyard"
    assert args.metrics_port is None  # resolved from $TORCHYARD_METRICS_PORT, else 9090
    assert parse("--metrics-port", "0").metrics_port == 0
    with pytest.raises(SystemExit):
        parse("--metrics-port", "70000")


def test_the_default_log_limit_is_bytes_within_what_the_spec_allows() -> None:
    assert parse().default_log_limit_bytes is None  # the launcher's own default
    assert parse("--default-log-limit-bytes", "4096").default_log_limit_bytes == 4096
    assert parse("--default-log-limit-bytes", str(1 << 40)).default_log_limit_bytes == 1 << 40
    for bad in ("4095", "0", "-1", str((1 << 40) + 1), "64Mi", "", "1e6"):
        with pytest.raises(SystemExit):
            parse("--default-log-limit-bytes", bad)
    # The bounds are those the CRD gives spec.policy.logLimitBytes.
    crd = yaml.safe_load((REPO / "crds" / "trainingruns.torchyard.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["policy"]["properties"]["logLimitBytes"]
    assert (field["minimum"], field["maximum"]) == (options.LOG_LIMIT_MIN, options.LOG_LIMIT_MAX)


def test_the_operator_command_hands_the_default_log_limit_to_the_builders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torchyard operator --default-log-limit-bytes`` reaches the memo that
    ``handlers.configure`` builds the Pods' Settings from (the Kopf loop itself is not run
    here: tests/integration/test_trainingruns.py runs it)."""
    seen: dict[str, object] = {}
    monkeypatch.setattr(operators.kopf, "configure", lambda **_: None)
    monkeypatch.setattr(operators, "run", lambda namespaces, **kw: seen.update(kw))
    operators.main_from_args(parse("--default-log-limit-bytes", "1048576", "--metrics-port", "0"))
    memo = operators._memo(None, (), seen["log_limit_bytes"], client=None)
    assert handlers._settings(memo).log_limit_bytes == 1 << 20
    operators.main_from_args(parse("--metrics-port", "0"))
    assert handlers._settings(operators._memo(None, (), None, client=None)).log_limit_bytes is None


def test_metrics_port_and_peering_name_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHYARD_METRICS_PORT", raising=False)
    monkeypatch.delenv("TORCHYARD_PEERING_NAME", raising=False)
    assert operators.metrics_port() == 9090
    assert operators.peering_name() is None
    monkeypatch.setenv("TORCHYARD_METRICS_PORT", "0")
    monkeypatch.setenv("TORCHYARD_PEERING_NAME", "from-env")
    assert operators.metrics_port() == 0
    assert operators.metrics_port(9100) == 9100  # the option wins
    assert operators.peering_name() == "from-env"
    assert operators.peering_name("from-option") == "from-option"


def test_a_disabled_metrics_server_is_not_started() -> None:
    assert telemetry.serve(0) is None


def test_a_namespaced_queue_drops_keys_of_other_namespaces() -> None:
    async def scenario() -> list[workqueue.Key]:
        queue = workqueue.WorkQueue(["team-a"])
        queue.add(("TrainingRun", "team-b", "theirs"))  # e.g. another install's gang
        queue.add(("TrainingRun", "team-a", "ours"))
        queue.backoff(("Environment", "team-b", "env"))
        taken = [await queue.take()]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(queue.take(), timeout=0.2)
        return taken

    assert asyncio.run(scenario()) == [("TrainingRun", "team-a", "ours")]


def test_a_cluster_wide_queue_takes_every_namespace() -> None:
    async def scenario() -> set[workqueue.Key]:
        queue = workqueue.WorkQueue()
        keys = {("TrainingRun", "team-a", "a"), ("TrainingRun", "team-b", "b")}
        for key in keys:
            queue.add(key)
        return {await queue.take(), await queue.take()}

    assert asyncio.run(scenario()) == {
        ("TrainingRun", "team-a", "a"),
        ("TrainingRun", "team-b", "b"),
    }


def test_runs_by_phase_counts_every_phase_and_forgets_deleted_runs() -> None:
    telemetry.reset_run_phases()
    telemetry.run_phase("team-a", "one", "Running")
    telemetry.run_phase("team-a", "two", "Running")
    telemetry.run_phase("team-a", "new", "")  # no status yet: Pending
    telemetry.run_phase("team-b", "three", "Failed")
    gauge = telemetry.TRAININGRUNS
    assert gauge.value(namespace="team-a", phase="Running") == 2
    assert gauge.value(namespace="team-a", phase="Pending") == 1
    assert gauge.value(namespace="team-b", phase="Failed") == 1
    telemetry.run_phase("team-a", "one", "Succeeded")
    telemetry.run_phase("team-a", "two", None)  # deleted
    assert gauge.value(namespace="team-a", phase="Running") == 0
    assert gauge.value(namespace="team-a", phase="Succeeded") == 1
    # A phase nobody is in reads 0 (a series that stays, rather than a stale value).
    assert 'torchyard_trainingruns{namespace="team-b",phase="Queued"} 0.0' in (
        telemetry.REGISTRY.render()
    )
    telemetry.run_phase("team-b", "three", "Failed")  # the same phase again: no change
    assert gauge.value(namespace="team-b", phase="Failed") == 1
    telemetry.run_phase("team-b", "three", None)  # the namespace's last run: its series go
    assert 'namespace="team-b"' not in telemetry.REGISTRY.render()
    telemetry.reset_run_phases()
    assert gauge.value(namespace="team-b", phase="Failed") == 0

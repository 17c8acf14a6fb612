"""The limit of each rank's archived log on the real control plane: a TrainingRun that sets
no ``spec.policy.logLimitBytes`` gets the operator's ``--default-log-limit-bytes`` (the
chart's ``operator.defaultLogLimitBytes``) in its node Pods, one that sets its own keeps
it. What the launcher does with the limit is tested in tests/unit/launcher/test_output.py
and benchmarks/chatty_rank.py."""

from __future__ import annotations

from tests.builders import TrainingRunBuilder
from tests.conftest import InProcessOperator
from tests.integration.conftest import operator_instead
from tests.integration.helpers import run_pods, wait_for
from torchyard import k8s
from torchyard.launch import output

DEFAULT = 1 << 20  # the operator's: 1 MiB


def launcher_env(namespace: str, run: str) -> dict[str, str]:
    """The environment of the run's node 0 launcher, once its Pod exists."""
    pods = wait_for(f"{run}'s node Pods", lambda: run_pods(namespace, run))
    trainer = pods[0]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in trainer["env"]}


def test_a_run_without_its_own_log_limit_gets_the_operators_default(
    operator: InProcessOperator, env: str
) -> None:
    with operator_instead(operator, log_limit_bytes=DEFAULT):
        for name, own in (("quiet", None), ("chatty", 8192)):
            run = TrainingRunBuilder(name, env).environment("pytorch").nodes(2).gpus(1)
            if own is not None:
                run = run.with_("spec.policy.logLimitBytes", own)
            k8s.create(run.pool("a100").obj())
        quiet, chatty = launcher_env(env, "quiet"), launcher_env(env, "chatty")
    assert quiet["TORCHYARD_LOG_LIMIT_BYTES"] == str(DEFAULT)
    assert output.log_limit(quiet) == DEFAULT  # what the launcher reads
    assert chatty["TORCHYARD_LOG_LIMIT_BYTES"] == "8192"  # its own wins

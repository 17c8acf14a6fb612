"""The launcher flags lines of any rank's output for the failure classes (a GPU's Xid
line, which comes before the traceback and is not in it) and for the run's
``policy.logRules``; the spec refuses a pattern that is not a regular expression."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builders import TrainingRunBuilder
from tests.unit.launcher.test_launcher import launch, termination
from torchyard import api
from torchyard.launch import classes, contract, output
from torchyard.planning import pods

XID_THEN_RAISE = (
    "import os, sys\n"
    "if os.environ['RANK'] == '1':\n"
    "    print('NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.', flush=True)\n"
    "    print('harmless: no GPU found', file=sys.stderr, flush=True)\n"
    "    raise RuntimeError('CUDA error: unknown error')\n"
    "import time; time.sleep(30)\n"
)


def test_flagged_lines_and_the_first_matching_rule_reach_the_termination_message(
    tmp_path: Path,
) -> None:
    rules = [
        {"pattern": "harmless", "action": "ignore"},
        {"pattern": r"CUDA error: \w+", "action": "cancelRetries"},
    ]
    done = launch(tmp_path, XID_THEN_RAISE, extra={"TORCHYARD_LOG_RULES": json.dumps(rules)})
    assert done.returncode == 1
    info = termination(tmp_path)
    assert info["evidence"] == [
        {"rank": 1, "line": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."}
    ]
    assert info["logRule"] == {
        "index": 1,
        "pattern": r"CUDA error: \w+",
        "action": "cancelRetries",
        "rank": 1,
        "line": "    raise RuntimeError('CUDA error: unknown error')",  # the first such line
    }


def test_without_rules_or_evidence_nothing_is_flagged(tmp_path: Path) -> None:
    done = launch(tmp_path, "raise SystemExit(2)")
    assert done.returncode == 2
    info = termination(tmp_path)
    assert "evidence" not in info and "logRule" not in info


def test_bad_rules_in_the_environment_are_a_launch_error(tmp_path: Path) -> None:
    done = launch(tmp_path, "pass", extra={"TORCHYARD_LOG_RULES": '[{"pattern": "("}]'})
    assert done.returncode == 2
    assert "TORCHYARD_LOG_RULES is not valid" in done.stderr


def test_log_rules_reach_the_launcher_and_bad_patterns_are_refused() -> None:
    body = TrainingRunBuilder("r").with_(
        "spec.policy", {"logRules": [{"pattern": "ECC", "action": "cancelRetries"}]}
    )
    run = api.parse_trainingrun(body.obj())
    env = {
        e["name"]: e.get("value")
        for e in pods.pod(run, 0, image="i")["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["TORCHYARD_LOG_RULES"]) == [{"pattern": "ECC", "action": "cancelRetries"}]
    bad = TrainingRunBuilder("r").with_(
        "spec.policy", {"logRules": [{"pattern": "Xid (79", "action": "ignore"}]}
    )
    with pytest.raises(api.InvalidSpec, match=r"not a valid regular expression .*escape"):
        api.parse_trainingrun(bad.obj())


def test_a_collective_timeout_of_nccl_or_gloo_is_evidence() -> None:
    gloo = (
        "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms "
        "for recv operation to complete"
    )
    nccl = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)"
    scanner = output.LogScanner()
    for rank, line in [(0, "RuntimeError: boom"), (0, gloo), (1, nccl)]:
        scanner.scan(rank, line.encode() + b"\n")
    assert scanner.evidence == [{"rank": 0, "line": gloo}, {"rank": 1, "line": nccl}]


def test_the_launcher_flags_lines_for_the_operators_classes_by_their_patterns() -> None:
    """One copy of the patterns: the classes whose lines the launcher flags classify with
    ``contract.FAILURE_PATTERNS``, and every flagged line of those tables is one
    the launcher flags."""
    assert set(contract.EVIDENCE_FLAGS) == set(contract.FAILURE_PATTERNS)
    for name, patterns in contract.FAILURE_PATTERNS.items():
        assert classes.BY_NAME[name].patterns == patterns
    for line, name in [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "GpuXid"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "CudaOOM"),
        ("Fatal Python error: Segmentation fault", "Segfault"),
        ("torch.distributed.DistStoreError: Timed out after 31 seconds", "RendezvousTimeout"),
        ("[Rank 1] Watchdog caught collective operation timeout", "CollectiveTimeout"),
    ]:
        assert contract.EVIDENCE.search(line), line
        found = classes.classify({"lines": [line]})
        assert found is not None and found[0].name == name, line

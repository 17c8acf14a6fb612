"""The controller reads progress from the running node Pods' logs at most every 10 s,
once a minute for a run whose logs have none, and not at all when no Pod runs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.builders import pod
from tests.unit.controller.fake_k8s import FakeK8s
from torchyard.controller import progress
from torchyard.controller.context import Context

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def line(step: int, min_step: int) -> str:
    return f'[torchyard] progress {{"step": {step}, "minStep": {min_step}, "total": 100}}'


def test_running_pods_are_read_at_most_every_poll_interval() -> None:
    fake = FakeK8s()
    fake.logs = {"r-0": ["[rank 0] hi", line(10, 9)], "r-1": [line(12, 8), "[rank 3] x"]}
    ctx = Context(k8s=fake)
    pods = [pod("r", i, phase="Running") for i in range(2)]
    first = progress.poll(ctx, "default", "uid-1", pods, T0)
    assert first is not None and first.progress is not None
    assert (first.progress["step"], first.progress["slowestRankLag"]) == (12, 4)
    assert first.again_seconds == progress.POLL_SECONDS
    assert sorted(fake.log_reads) == ["r-0", "r-1"]
    soon = progress.poll(ctx, "default", "uid-1", pods, T0 + timedelta(seconds=4))
    assert soon is not None and soon.progress is None and soon.again_seconds == 6
    assert len(fake.log_reads) == 2  # not read again before 10 s
    later = progress.poll(ctx, "default", "uid-1", pods, T0 + timedelta(seconds=10))
    assert later is not None and later.progress is not None and len(fake.log_reads) == 4


def test_a_run_that_never_reports_is_read_once_a_minute() -> None:
    fake = FakeK8s()
    fake.logs = {"q-0": ["[rank 0] no progress here"]}
    ctx = Context(k8s=fake)
    pods = [pod("q", 0, phase="Running")]
    now = T0
    for _ in range(progress.QUIET_AFTER):
        polled = progress.poll(ctx, "default", "uid-2", pods, now)
        assert polled is not None and polled.progress is None
        now += timedelta(seconds=progress.POLL_SECONDS)
    assert polled.again_seconds == progress.QUIET_POLL_SECONDS
    assert progress.poll(ctx, "default", "uid-2", pods, now) == progress.Polled(
        None, progress.QUIET_POLL_SECONDS - progress.POLL_SECONDS
    )


def test_no_running_pod_no_read_and_a_missing_log_is_no_error() -> None:
    fake = FakeK8s()  # no logs at all: the kubelet answers 400
    ctx = Context(k8s=fake)
    assert progress.poll(ctx, "default", "uid-3", [pod("s", 0, phase="Pending")], T0) is None
    assert fake.log_reads == []
    polled = progress.poll(ctx, "default", "uid-3", [pod("s", 0, phase="Running")], T0)
    assert polled is not None and polled.progress is None and fake.log_reads == ["s-0"]


def test_a_kubelet_that_does_not_answer_ends_the_poll_instead_of_holding_it_per_pod() -> None:
    fake = FakeK8s()
    fake.logs = {"g-0": [line(5, 5)], **{f"g-{i}": [line(5, 5)] for i in range(2, 64)}}
    fake.silent_kubelets = {"g-1"}  # each read of it costs the read timeout
    ctx = Context(k8s=fake)
    pods = [pod("g", i, phase="Running") for i in range(64)]
    polled = progress.poll(ctx, "default", "uid-4", pods, T0)
    # node 0's progress is kept; one timeout paid, not 63
    assert fake.log_reads == ["g-0", "g-1"]
    assert polled is not None and polled.progress is not None
    assert polled.progress["step"] == 5


def test_a_chatty_nodes_log_is_read_within_a_bound() -> None:
    """A rank that writes long lines fast: a poll reads at most LIMIT_BYTES of the node's
    log, not TAIL_LINES of its longest lines (the launcher shows at most 64 KiB a line)."""
    fake = FakeK8s()
    chatty = "[rank 0] " + "x" * 65536
    fake.logs = {"c-0": [line(5, 5)] + [chatty] * progress.TAIL_LINES}
    ctx = Context(k8s=fake)
    progress.poll(ctx, "default", "uid-3", [pod("c", 0, phase="Running")], T0)
    assert fake.log_reads == ["c-0"]
    assert 0 < fake.log_bytes <= progress.LIMIT_BYTES

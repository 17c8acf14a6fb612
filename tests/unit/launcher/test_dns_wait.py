"""Waiting for MASTER_ADDR to resolve: the headless Service's record appears a moment after
node 0 has its IP, and every rank waits for it, so the launcher looks again often (at most
``DNS_POLL_SECONDS`` apart) rather than backing off for seconds past the moment it is there."""

from __future__ import annotations

import io
import socket
from typing import Any

import pytest

from torchyard.launch import contract, ranks


class Clock:
    """time.monotonic and time.sleep of a fake clock that only sleeping moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_name_is_looked_up_again_soon_after_it_appears(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    appears_at = 3.0  # seconds after the launcher started waiting

    def getaddrinfo(host: str, port: Any) -> list[Any]:
        if clock.now < appears_at:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 0))]

    monkeypatch.setattr(ranks.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(ranks.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(ranks.time, "sleep", clock.sleep)
    out = io.StringIO()
    ranks.wait_for_dns("r-0.r.ns.svc", 300, out)
    assert "waiting for r-0.r.ns.svc to resolve" in out.getvalue()
    assert max(clock.sleeps) <= ranks.DNS_POLL_SECONDS <= 0.25
    assert clock.now - appears_at <= ranks.DNS_POLL_SECONDS  # found at the next look


def test_a_name_that_never_resolves_fails_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()

    def getaddrinfo(host: str, port: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(ranks.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(ranks.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(ranks.time, "sleep", clock.sleep)
    with pytest.raises(contract.LaunchError, match="did not resolve within 5s"):
        ranks.wait_for_dns("r-0.r.ns.svc", 5, io.StringIO())
    assert 5 <= clock.now <= 5 + ranks.DNS_POLL_SECONDS

"""``torchyard ui``: its options are checked before anything starts (a port out of range,
``--address`` without ``--in-cluster``, a Host name with a port, a proxy that is no
network, half a certificate, a short key), each with one line and an exit code; the
good ones reach the view that is served."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.unit.registry.test_tls_and_tokens import make_pki
from torchyard import cli
from torchyard.web import app, csrf, front


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["ui", "--port", "70000"], "a port is 0 to 65535"),
        (["ui", "--port", "-1"], "a port is 0 to 65535"),
        (["ui", "--port", "http"], "a port is 0 to 65535"),
    ],
)
def test_a_bad_port_is_refused_by_the_parser(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_address_goes_with_in_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["ui", "-n", "team", "--address", "0.0.0.0"])
    assert code == 2
    assert "--address goes with --in-cluster" in capsys.readouterr().err


def test_bad_front_options_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    missing = str(tmp_path / "nope.pem")
    for argv, said in (
        (["--allowed-host", "ui.example.test:443"], "not a host name or address without a port"),
        (["--allowed-host", "https://ui.example.test"], "without a port"),
        (["--address", "0.0.0.0:8080"], "not a host name or address without a port"),
        (["--trusted-proxy", "proxy.example"], "does not appear to be an IPv4 or IPv6 network"),
        (["--tls-cert", missing], "--tls-cert and --tls-key go together"),
        (["--tls-cert", missing, "--tls-key", missing], f"cannot serve TLS with {missing}"),
        (["--csrf-key-file", str(short)], "holds 9 bytes; the key needs at least 32"),
        (["--csrf-key-file", missing], f"cannot read --csrf-key-file {missing}"),
    ):
        code = cli.main(["ui", "-n", "team", "--in-cluster", *argv])
        assert code == 2, argv
        assert said in capsys.readouterr().err, argv


def test_the_front_options_reach_the_served_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path / "pki", "ui")
    key = tmp_path / "csrf.key"
    key.write_text("k" * 40 + "\n")
    served: dict[str, Any] = {}

    def serve(app_: web.Application, host: str, port: int, ready: Any, tls: Any) -> None:
        served.update(app=app_, host=host, port=port, tls=tls)

    monkeypatch.setattr(app, "serve", serve)
    code = cli.main(
        [
            "ui", "-n", "team", "--in-cluster", "--port", "8080",
            "--allowed-host", "UI.example.test", "--allowed-host", "10.0.0.7",
            "--trusted-proxy", "10.244.0.0/16",
            "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
            "--csrf-key-file", str(key),
        ]
    )  # fmt: skip
    assert code == 0
    view = served["app"]
    assert served["host"] == "0.0.0.0" and served["port"] == 8080
    assert view[front.HOSTS] == {"ui.example.test", "10.0.0.7"}
    assert view[front.PROXIES] == (ipaddress.ip_network("10.244.0.0/16"),)
    assert view[csrf.KEY] == b"k" * 40
    assert isinstance(served["tls"], ssl.SSLContext)

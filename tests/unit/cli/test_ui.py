"""``torchyard ui``: its options are checked before anything starts (a port out of range,
``--address`` without ``--in-cluster``), each with one line and an exit code."""

from __future__ import annotations

import pytest

from torchyard import cli


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

"""Reading apt's sources for the mirror debootstrap uses (tests/cluster/debian.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster import debian

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Enabled: no
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
"""


def test_deb822_comments_inside_a_stanza_do_not_split_it() -> None:
    entries = debian.parse_sources(DEB822)
    assert entries == [
        ("http://deb.debian.org/debian", ["bookworm", "bookworm-updates"], ["main"]),
        ("http://deb.debian.org/debian-security", ["bookworm-security"], ["main"]),
    ]
    assert debian.pick_mirror(entries, "bookworm") == "http://deb.debian.org/debian"


def test_one_line_sources_with_options_and_deb_src() -> None:
    text = (
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib\n"
        "# deb http://commented.example/debian bookworm main\n"
    )
    entries = debian.parse_sources(text)
    assert entries == [("http://mirror.example/debian/", ["bookworm"], ["main", "contrib"])]
    assert debian.pick_mirror(entries, "bookworm") == "http://mirror.example/debian"


@pytest.mark.parametrize(
    "uri", ["file:///srv/mirror", "cdrom:[Debian]/", "mirror+file:/etc/apt/mirrors.txt", "/abs"]
)
def test_only_an_http_mirror_is_handed_to_debootstrap(uri: str) -> None:
    with pytest.raises(debian.SetupError, match="TORCHYARD_DEBIAN_MIRROR"):
        debian.pick_mirror([(uri, ["bookworm"], ["main"])], "bookworm")


def test_no_mirror_for_the_suite_says_how_to_add_one() -> None:
    advice = re.escape("deb http://deb.debian.org/debian trixie main")
    with pytest.raises(debian.SetupError, match=advice):
        debian.pick_mirror(debian.parse_sources(DEB822), "trixie")


def test_the_mirror_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_DEBIAN_MIRROR", "http://local.example/debian/")
    assert debian.debian_mirror("bookworm") == "http://local.example/debian"
    monkeypatch.setenv("TORCHYARD_DEBIAN_MIRROR", "file:///etc")
    with pytest.raises(debian.SetupError):
        debian.debian_mirror("bookworm")


def test_the_release_codename_comes_from_os_release(tmp_path: Path) -> None:
    (tmp_path / "os-release").write_text('NAME="Debian"\nVERSION_CODENAME=bookworm\n')
    assert debian.release_codename(tmp_path / "os-release") == "bookworm"
    (tmp_path / "os-release").write_text('NAME="Something"\n')
    with pytest.raises(debian.SetupError, match="TORCHYARD_DEBIAN_SUITE"):
        debian.release_codename(tmp_path / "os-release")


def test_present_packages_are_not_installed_again(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("")
    assert debian.ensure_packages({"some-package": str(tmp_path / "tool")}, log=False) == []
    assert debian.missing_packages({"other": str(tmp_path / "absent")}) == ["other"]

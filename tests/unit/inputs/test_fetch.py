"""Fetching a web input into the cache, against a local HTTP server the test starts:
a file and an archive land as verified entries, a second fetch is a hit that sends no
byte, a killed fetch resumes with a Range request, and every bad input (wrong sha256,
HTTP errors, oversize, include matching nothing) is an InputError naming the URI that
leaves nothing in ``entries/``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.unit.inputs.server import Files, serving
from torchyard.inputs import cache, fetch
from torchyard.inputs.uris import InputError, Source

LIMIT = 1 << 30


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def entries(root: Path) -> list[str]:
    return sorted(os.listdir(root / "entries")) if (root / "entries").is_dir() else []


def test_a_file_lands_in_a_verified_entry_and_a_second_fetch_sends_nothing(tmp_path: Path) -> None:
    body = os.urandom(300_000)
    state = Files({"/data/weights.bin": body})
    with serving(state) as url:
        source = Source(f"{url}/data/weights.bin", sha(body))
        first = fetch.fetch(source, str(tmp_path), LIMIT)
        sent = state.sent
        second = fetch.fetch(source, str(tmp_path), LIMIT)
    assert first.fetched_bytes == len(body) == sent
    assert second.fetched_bytes == 0 and state.sent == sent
    assert second.entry == first.entry
    data = Path(cache.data_dir(str(tmp_path), source.key))
    assert (data / "weights.bin").read_bytes() == body
    assert first.entry.bytes == len(body)
    assert first.entry.revision == sha(body)
    assert first.entry.digest.startswith("sha256:")
    assert cache.verify(str(tmp_path), first.entry) == []


def test_an_archive_is_unpacked_with_its_patterns(tmp_path: Path) -> None:
    archive = tar_gz({"birds/a.jpg": b"a", "birds/b.jpg": b"bb", "birds/notes.txt": b"n"})
    with serving(Files({"/birds.tar.gz": archive})) as url:
        source = Source(f"{url}/birds.tar.gz", sha(archive), include=("*.jpg",))
        done = fetch.fetch(source, str(tmp_path), LIMIT)
    data = Path(cache.data_dir(str(tmp_path), source.key))
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file()) == [
        "birds/a.jpg",
        "birds/b.jpg",
    ]
    assert done.entry.bytes == 3
    assert [f["path"] for f in done.entry.files] == ["birds/a.jpg", "birds/b.jpg"]


def test_patterns_change_the_key(tmp_path: Path) -> None:
    a = Source("https://example.org/x.tgz", "0" * 64, include=("*.jpg",))
    b = Source("https://example.org/x.tgz", "0" * 64, include=("*.png",))
    c = Source("https://example.org/x.tgz", "1" * 64, include=("*.jpg",))
    assert len({a.key, b.key, c.key}) == 3
    assert a.key == Source("https://example.org/x.tgz", "0" * 64, include=("*.jpg",)).key


def test_a_killed_fetch_resumes_with_a_range_request(tmp_path: Path) -> None:
    body = os.urandom(500_000)
    state = Files({"/big.bin": body}, cut_after=200_000)
    with serving(state) as url:
        source = Source(f"{url}/big.bin", sha(body))
        with pytest.raises(InputError):
            fetch.fetch(source, str(tmp_path), LIMIT)
        assert entries(tmp_path) == [], "nothing half-written is an entry"
        part = Path(cache.staging_dir(str(tmp_path), source.key)) / "download.part"
        kept = part.stat().st_size
        assert 0 < kept < len(body)
        state.cut_after = None
        done = fetch.fetch(source, str(tmp_path), LIMIT)
    assert state.requests[-1] == ("/big.bin", f"bytes={kept}-")
    assert done.fetched_bytes == len(body) - kept
    assert (Path(cache.data_dir(str(tmp_path), source.key)) / "big.bin").read_bytes() == body


def test_a_server_without_ranges_starts_again_from_the_first_byte(tmp_path: Path) -> None:
    body = os.urandom(100_000)
    state = Files({"/f.bin": body}, cut_after=40_000, ranges=False)
    with serving(state) as url:
        source = Source(f"{url}/f.bin", sha(body))
        with pytest.raises(InputError):
            fetch.fetch(source, str(tmp_path), LIMIT)
        state.cut_after = None
        done = fetch.fetch(source, str(tmp_path), LIMIT)
    assert done.fetched_bytes == len(body)
    assert (Path(cache.data_dir(str(tmp_path), source.key)) / "f.bin").read_bytes() == body


def test_a_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    with serving(Files({"/x.bin": b"real"})) as url:
        source = Source(f"{url}/x.bin", sha(b"other"))
        with pytest.raises(InputError, match=r"its sha256 is .* the input says"):
            fetch.fetch(source, str(tmp_path), LIMIT)
    assert entries(tmp_path) == []
    assert not (Path(cache.staging_dir(str(tmp_path), source.key)) / "download.part").exists()


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (404, "HTTP 404 .*nothing is there: check the URL"),
        (403, "HTTP 403 .*without credentials"),
        (401, "HTTP 401 .*credentials"),
        (500, "HTTP 500 .*submit the run again"),
        (503, "HTTP 503 .*submit the run again"),
    ],
)
def test_http_errors_name_the_uri_the_status_and_the_fix(
    tmp_path: Path, status: int, words: str
) -> None:
    with serving(Files(status={"/x.bin": status})) as url:
        source = Source(f"{url}/x.bin", "0" * 64)
        with pytest.raises(InputError, match=f"^{url}/x.bin: {words}"):
            fetch.fetch(source, str(tmp_path), LIMIT)
    assert entries(tmp_path) == []


def test_an_unreachable_host_says_so(tmp_path: Path) -> None:
    source = Source("http://127.0.0.1:9/x.bin", "0" * 64)
    with pytest.raises(InputError, match="cannot reach the server"):
        fetch.fetch(source, str(tmp_path), LIMIT)


def test_a_file_over_the_cache_limit_is_refused_before_its_body(tmp_path: Path) -> None:
    body = os.urandom(10_000)
    state = Files({"/big.bin": body})
    limit = "over the inputs cache's limit of 5000 bytes"
    with serving(state) as url, pytest.raises(InputError, match=limit):
        fetch.fetch(Source(f"{url}/big.bin", sha(body)), str(tmp_path), 5000)
    assert entries(tmp_path) == []


def test_an_archive_over_the_cache_limit_is_refused(tmp_path: Path) -> None:
    archive = tar_gz({"zeros.bin": bytes(200_000)})  # compresses to a few hundred bytes
    with serving(Files({"/bomb.tgz": archive})) as url:
        source = Source(f"{url}/bomb.tgz", sha(archive))
        with pytest.raises(InputError, match="unpacks to more than 100000 bytes"):
            fetch.fetch(source, str(tmp_path), 100_000)
    assert entries(tmp_path) == []


@pytest.mark.parametrize(
    ("include", "exclude"), [(("*.png",), ()), ((), ("*",)), (("images/*",), ("*.jpg",))]
)
def test_patterns_that_keep_nothing_are_an_error_naming_them(
    tmp_path: Path, include: tuple[str, ...], exclude: tuple[str, ...]
) -> None:
    archive = tar_gz({"images/a.jpg": b"a"})
    with serving(Files({"/a.tgz": archive})) as url:
        source = Source(f"{url}/a.tgz", sha(archive), include, exclude)
        with pytest.raises(InputError, match=r"holds no file.*check the patterns"):
            fetch.fetch(source, str(tmp_path), LIMIT)
    assert entries(tmp_path) == []


def test_a_damaged_entry_is_fetched_again(tmp_path: Path) -> None:
    body = b"good bytes"
    state = Files({"/x.bin": body})
    with serving(state) as url:
        source = Source(f"{url}/x.bin", sha(body))
        fetch.fetch(source, str(tmp_path), LIMIT)
        (Path(cache.data_dir(str(tmp_path), source.key)) / "x.bin").write_bytes(b"evil bytes")
        again = fetch.fetch(source, str(tmp_path), LIMIT)
    assert again.fetched_bytes == len(body)
    assert (Path(cache.data_dir(str(tmp_path), source.key)) / "x.bin").read_bytes() == body


def test_the_job_entry_point_writes_its_outcome_as_json(tmp_path: Path) -> None:
    body = b"abc"
    log = tmp_path / "termination"
    root = tmp_path / "cache"
    with serving(Files({"/a.txt": body})) as url:
        source = Source(f"{url}/a.txt", sha(body))
        args = [
            "--cache",
            str(root),
            "--uri",
            source.uri,
            "--sha256",
            sha(body),
            "--max-bytes",
            str(LIMIT),
            "--key",
            source.key,
        ]
        assert fetch.main(args, str(log)) == 0
        done = json.loads(log.read_text())
        assert done["fetchedBytes"] == 3
        assert done["entry"]["key"] == source.key and done["entry"]["bytes"] == 3
        assert fetch.main([*args[:-1], "f" * 64], str(log)) == 1
        assert "different versions" in json.loads(log.read_text())["error"]
        assert fetch.main([*args, "--evict", source.key], str(log)) == 0
        assert json.loads(log.read_text())["fetchedBytes"] == 3, "evicted, so fetched again"

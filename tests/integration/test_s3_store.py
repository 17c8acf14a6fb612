"""s3:// inputs fetched from a real S3 store (SeaweedFS's S3 gateway, ``tests/cluster/s3.py``,
built before the tests): a prefix once then from the cache, patterns, wrong credentials, a
missing bucket, the size limit before a byte, a killed fetch resumed, a changed listing
fetched again, the revision; and ``torchyard run --local`` reading the store with the
shell's credentials. No cluster: the store is a process this module starts. Signature V4,
the listing's parsing and the keys refused: tests/unit/inputs/test_s3.py."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import s3 as store_server
from tests.unit.inputs.server import entry_files
from tests.unit.local.test_inputs import local_argv, project, seen
from torchyard import cli
from torchyard.inputs import cache, s3
from torchyard.inputs.fetch import fetch
from torchyard.inputs.uris import InputError, Source

LIMIT = 1 << 30
BIG = os.urandom(3 << 20)
FILES = {"train/a.jpg": b"a" * 1000, "train/sub/b.jpg": b"b" * 2000, "train/notes.txt": b"n"}


@pytest.fixture(scope="module")
def store(seaweedfs: Path) -> Iterator[store_server.Store]:
    with store_server.running(seaweedfs) as running:
        running.bucket("birds")
        for key, body in {**FILES, "big/blob.bin": BIG, "other/x.txt": b"x"}.items():
            running.put("birds", key, body)
        yield running


def test_a_prefix_is_fetched_once_then_served_from_the_cache(store, tmp_path) -> None:
    source = Source("s3://birds/train", secret="store")
    first = fetch(source, str(tmp_path), LIMIT, store.env())
    assert entry_files(str(tmp_path), source.key) == {
        k.removeprefix("train/"): v for k, v in FILES.items()
    }
    assert first.fetched_bytes == sum(len(v) for v in FILES.values())
    assert first.entry.revision.startswith("sha256:")
    second = fetch(source, str(tmp_path), LIMIT, store.env())
    assert second.fetched_bytes == 0
    assert second.entry == first.entry


def test_patterns_keep_their_keys_and_a_pattern_that_keeps_none_fails(store, tmp_path) -> None:
    jpg = Source("s3://birds/train", include=("*.jpg",), exclude=("sub/*",))
    fetch(jpg, str(tmp_path), LIMIT, store.env())
    assert entry_files(str(tmp_path), jpg.key) == {"a.jpg": FILES["train/a.jpg"]}
    none = Source("s3://birds/train", include=("*.png",))
    with pytest.raises(
        InputError, match=r"s3://birds/train holds no file matching include \['\*.png'\]"
    ):
        fetch(none, str(tmp_path), LIMIT, store.env())
    assert cache.read(str(tmp_path), none.key) is None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"AWS_ACCESS_KEY_ID": "nobody"}, "InvalidAccessKeyId"),
        ({"AWS_SECRET_ACCESS_KEY": "wrong-secret"}, "SignatureDoesNotMatch"),
    ],
)
def test_wrong_credentials_name_the_input_and_the_s3_error(store, tmp_path, change, code) -> None:
    source = Source("s3://birds/train")
    with pytest.raises(InputError) as err:
        fetch(source, str(tmp_path), LIMIT, {**store.env(), **change})
    assert str(err.value).startswith("s3://birds/train: S3 answered HTTP 403")
    assert code in str(err.value)
    assert cache.read(str(tmp_path), source.key) is None


def test_a_missing_bucket_says_so(store, tmp_path) -> None:
    with pytest.raises(
        InputError, match=r"s3://no-such-bucket/x: S3 answered HTTP 404 \(NoSuchBucket"
    ):
        fetch(Source("s3://no-such-bucket/x"), str(tmp_path), LIMIT, store.env())


def test_an_input_over_the_limit_is_refused_before_a_byte(store, tmp_path) -> None:
    with pytest.raises(InputError, match="over the inputs cache's limit"):
        fetch(Source("s3://birds/big"), str(tmp_path), 1 << 20, store.env())
    assert not os.listdir(
        os.path.join(cache.staging_dir(str(tmp_path), Source("s3://birds/big").key))
    )


def test_a_killed_fetch_resumes_where_it_stopped(store, tmp_path) -> None:
    source = Source("s3://birds/big")
    host, port = store.endpoint.removeprefix("http://").split(":")
    cutting = store_server.CuttingProxy((host, int(port)), cut_after=(2 << 20) + 512)
    try:
        with pytest.raises(InputError, match="the next fetch goes on from there"):
            fetch(source, str(tmp_path), LIMIT, store.env(cutting.endpoint))
    finally:
        cutting.close()
    parts = os.path.join(cache.staging_dir(str(tmp_path), source.key), s3.PARTS)
    kept = sum(os.path.getsize(os.path.join(parts, p)) for p in os.listdir(parts))
    assert 0 < kept < len(BIG)
    done = fetch(source, str(tmp_path), LIMIT, store.env())
    assert done.fetched_bytes == len(BIG) - kept
    assert entry_files(str(tmp_path), source.key) == {"blob.bin": BIG}


def test_a_changed_listing_is_fetched_again(store, tmp_path) -> None:
    store.put("birds", "changing/one.txt", b"1")
    source = Source("s3://birds/changing")
    first = fetch(source, str(tmp_path), LIMIT, store.env())
    store.put("birds", "changing/two.txt", b"22")
    second = fetch(source, str(tmp_path), LIMIT, store.env())
    assert second.entry.revision != first.entry.revision
    assert entry_files(str(tmp_path), source.key) == {"one.txt": b"1", "two.txt": b"22"}
    assert second.fetched_bytes == 3


def test_the_revision_is_a_digest_of_keys_sizes_and_etags(store) -> None:
    env = store.env()
    source = Source("s3://birds/train", include=("a.jpg",))
    etag = hashlib.md5(FILES["train/a.jpg"], usedforsecurity=False).hexdigest()
    kept = [("a.jpg", s3.Object("train/a.jpg", 1000, etag))]
    assert s3.revision(source, env) == s3.revision_of(kept)


def test_an_s3_input_reads_the_store_with_the_shells_credentials(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    seaweedfs: Path,
) -> None:
    monkeypatch.setenv("TORCHYARD_INPUTS_CACHE", str(tmp_path / "cache"))
    spec = {"name": "shots", "uri": "s3://local-birds/train", "secretRef": "birds-store"}
    (tmp_path / "src").mkdir()
    src = project(tmp_path / "src", [spec], ["$TORCHYARD_INPUT_SHOTS"])
    monkeypatch.chdir(src)
    with store_server.running(seaweedfs) as store:
        store.bucket("local-birds")
        store.put("local-birds", "train/a.jpg", b"A")
        store.put("local-birds", "train/b/c.jpg", b"C")
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
        assert cli.main(local_argv(tmp_path)) == 0
        assert seen(tmp_path / "runs") == ["a.jpg=A", "b/c.jpg=C"]
        assert cli.main(local_argv(tmp_path)) == 0
        assert "input shots: 2 bytes ready (0 fetched)" in capsys.readouterr().err
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        store.put("local-birds", "train/d.jpg", b"D")  # a changed listing: fetched again
        assert cli.main(local_argv(tmp_path)) != 0
    err = capsys.readouterr().err
    assert "input shots (s3://local-birds/train)" in err and "SignatureDoesNotMatch" in err

"""s3:// inputs: Signature V4 against AWS's published examples, the listing's parsing, the
keys and URIs refused, and fetches from a real S3 store (SeaweedFS's S3 gateway)."""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Iterator

import pytest

from tests.cluster import s3 as store_server
from tests.unit.inputs.server import entry_files
from torchyard.inputs import cache, s3
from torchyard.inputs.fetch import fetch
from torchyard.inputs.uris import InputError, Source, bucket_of, cache_key

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SUITE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
LIMIT = 1 << 30


def _signature(url: str, headers: dict[str, str], key: str, secret: str, service: str, when: str):
    signed = s3.signed_headers(
        "GET",
        url,
        headers,
        access_key=key,
        secret_key=secret,
        region="us-east-1",
        service=service,
        when=datetime.datetime.strptime(when, "%Y%m%dT%H%M%SZ"),
    )
    return signed["authorization"].rsplit("Signature=", 1)[1]


@pytest.mark.parametrize(
    ("url", "headers", "key", "secret", "service", "when", "expected"),
    [
        # aws-sig-v4-test-suite: get-vanilla
        (
            "https://example.amazonaws.com/",
            {},
            "AKIDEXAMPLE",
            SUITE_SECRET,
            "service",
            "20150830T123600Z",
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        ),
        # aws-sig-v4-test-suite: get-vanilla-query-order-key-case (the query is sorted)
        (
            "https://example.amazonaws.com/?Param2=value2&Param1=value1",
            {},
            "AKIDEXAMPLE",
            SUITE_SECRET,
            "service",
            "20150830T123600Z",
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        ),
        # The S3 API reference's examples: GET Object with a Range header ...
        (
            "https://examplebucket.s3.amazonaws.com/test.txt",
            {"Range": "bytes=0-9", "x-amz-content-sha256": s3.EMPTY_SHA256},
            "AKIAIOSFODNN7EXAMPLE",
            AWS_SECRET,
            "s3",
            "20130524T000000Z",
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
        ),
        # ... and GET Bucket (list objects) with a query.
        (
            "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J",
            {"x-amz-content-sha256": s3.EMPTY_SHA256},
            "AKIAIOSFODNN7EXAMPLE",
            AWS_SECRET,
            "s3",
            "20130524T000000Z",
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7",
        ),
    ],
)
def test_signature_v4_matches_the_published_examples(
    url: str, headers: dict[str, str], key: str, secret: str, service: str, when: str, expected: str
) -> None:
    assert _signature(url, headers, key, secret, service, when) == expected


def test_the_authorization_names_the_scope_and_every_signed_header() -> None:
    signed = s3.signed_headers(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        {"x-amz-content-sha256": s3.EMPTY_SHA256},
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key=AWS_SECRET,
        region="eu-west-1",
        when=datetime.datetime(2013, 5, 24),
    )
    assert signed["x-amz-date"] == "20130524T000000Z"
    assert signed["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/eu-west-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="
    )


PAGE = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>birds</Name><Prefix>train/</Prefix><KeyCount>2</KeyCount>
  <IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents><Key>train/a.jpg</Key><Size>12</Size><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag></Contents>
  <Contents><Key>train/b/c.jpg</Key><Size>0</Size><ETag>"d41d8cd98f00b204e9800998ecf8427e-2"</ETag></Contents>
</ListBucketResult>"""


def test_a_listing_page_gives_its_objects_and_the_next_token() -> None:
    objects, token = s3.parse_listing(PAGE)
    assert objects == [
        s3.Object("train/a.jpg", 12, "9b2cf535f27731c974343645a3985328"),
        s3.Object("train/b/c.jpg", 0, "d41d8cd98f00b204e9800998ecf8427e-2"),
    ]
    assert token == "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="


def test_the_last_page_has_no_token_and_a_truncated_page_needs_one() -> None:
    last = PAGE.replace(b"<IsTruncated>true", b"<IsTruncated>false")
    assert s3.parse_listing(last)[1] == ""
    cut = PAGE.replace(b"<NextContinuationToken>", b"<Other>").replace(
        b"</NextContinuationToken>", b"</Other>"
    )
    with pytest.raises(InputError, match="no continuation token"):
        s3.parse_listing(cut)


@pytest.mark.parametrize("body", [b"not xml", b"<a><Contents><Size>-1</Size></Contents></a>"])
def test_a_listing_that_is_not_one_is_refused(body: bytes) -> None:
    with pytest.raises(InputError, match="S3 listing"):
        s3.parse_listing(body)


def test_an_error_document_gives_its_code_and_message() -> None:
    body = b"<Error><Code>NoSuchBucket</Code><Message>The bucket does not exist</Message></Error>"
    assert s3.error_of(body) == ("NoSuchBucket", "The bucket does not exist")
    assert s3.error_of(b"<html>") == ("", "")


@pytest.mark.parametrize(
    "key",
    [
        "data/../escape.txt",
        "data/..",
        "data/./a",
        "data//a",
        "data//etc/passwd",
        "data/a\\..\\..\\b",
        "data/%2e%2e/b",
        "data/a%2Fb",
        "data/C:/windows",
        "data/a\x00b",
        "data/",
    ],
)
def test_keys_that_would_leave_the_folder_are_refused(key: str) -> None:
    with pytest.raises(InputError, match="would not stay inside"):
        s3.relative(key, "data/")


def test_a_key_that_is_also_a_folder_of_another_is_refused() -> None:
    objects = [s3.Object("d/a", 1, "x"), s3.Object("d/a/b", 1, "y")]
    with pytest.raises(InputError, match="cannot be a file and a folder"):
        s3._kept(Source("s3://birds/d"), objects, "d/")
    assert [p for p, _ in s3._kept(Source("s3://birds/d", exclude=("a",)), objects, "d/")] == [
        "a/b"
    ]


def test_a_key_below_the_prefix_keeps_its_folders() -> None:
    assert s3.relative("data/train/a.jpg", "data/") == "train/a.jpg"
    assert s3.relative("a.jpg", "") == "a.jpg"


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://birds", "birds", ""),
        ("s3://birds/", "birds", ""),
        ("s3://birds/train", "birds", "train/"),
        ("s3://my.bucket-1/a/b/", "my.bucket-1", "a/b/"),
    ],
)
def test_an_s3_uri_names_a_bucket_and_a_prefix(uri: str, bucket: str, prefix: str) -> None:
    assert bucket_of(uri) == (bucket, prefix)


@pytest.mark.parametrize(
    "uri",
    [
        "s3://",
        "s3://ab",
        "s3://Birds",
        "s3://-birds",
        "s3://user:pw@birds",
        "s3://birds/../other",
        "s3://birds/a/%2e%2e/b",
        "s3://birds/a//b",
        "s3://birds/a\\b",
        "s3://birds/./a",
    ],
)
def test_s3_uris_that_name_no_bucket_or_leave_the_prefix_are_refused(uri: str) -> None:
    with pytest.raises(InputError):
        bucket_of(uri)


def test_the_secret_is_part_of_an_s3_key() -> None:
    one = Source("s3://birds/train", secret="store-a")
    assert cache_key(one) != cache_key(Source("s3://birds/train", secret="store-b"))
    assert cache_key(one) != cache_key(
        Source("s3://birds/train", secret="store-a", include=("*.jpg",))
    )


# --- against a real S3 store -------------------------------------------------------------

BIG = os.urandom(3 << 20)
FILES = {"train/a.jpg": b"a" * 1000, "train/sub/b.jpg": b"b" * 2000, "train/notes.txt": b"n"}


@pytest.fixture(scope="module")
def store() -> Iterator[store_server.Store]:
    with store_server.running() as running:
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

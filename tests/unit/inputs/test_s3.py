"""s3:// inputs: Signature V4 against AWS's published examples, the listing's parsing, the
keys and URIs refused. Fetches from a real S3 store (SeaweedFS's S3 gateway):
tests/integration/test_s3_store.py."""

from __future__ import annotations

import contextlib
import datetime
import http.server
import threading
from collections.abc import Iterator

import pytest

from torchyard.inputs import s3
from torchyard.inputs.uris import InputError, Source, bucket_of, cache_key, parse

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SUITE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"


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
        # encoded traversal, any case, any mix
        "data/%2E%2E/b",
        "data/.%2e/b",
        "data/%2e./b",
        "data/a%2f..%2fb",
        "data/a%5C..%5Cb",
        "data/a%00b",
        # control characters (a file name that rewrites a log line)
        "data/a\nb",
        "data/a\rb",
        "data/a\x1bb",
        "data/a\x7fb",
        # a trailing dot segment
        "data/a/..",
        "data/a/.",
    ],
)
def test_keys_that_would_leave_the_folder_are_refused(key: str) -> None:
    with pytest.raises(InputError, match="would not stay inside"):
        s3.relative(key, "data/")


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "..", "./x", "C:/x", "C:\\x", "\\x"])
def test_keys_of_a_bucket_read_whole_may_not_be_absolute_or_leave_it(key: str) -> None:
    with pytest.raises(InputError, match="would not stay inside"):
        s3.relative(key, "")


@pytest.mark.parametrize(
    "key",
    [
        "data/" + "a" * 256,  # a file name longer than a file system holds
        "data/ok/" + "é" * 128,  # 256 bytes in 128 characters
        "data/" + "b/" * 510 + "c",  # longer than an S3 key
    ],
)
def test_oversize_keys_are_refused(key: str) -> None:
    with pytest.raises(InputError, match="rename the object or exclude it"):
        s3.relative(key, "data/")


def test_the_longest_names_a_key_may_have_are_kept() -> None:
    name = "a" * 255
    assert s3.relative("data/" + name, "data/") == name
    deep = "/".join(["b" * 100] * 10)  # 1009 bytes below the prefix, 1014 in all
    assert s3.relative("data/" + deep, "data/") == deep


class _Paging(http.server.BaseHTTPRequestHandler):
    """A store whose listing never ends: every page holds one object and says there is
    one more, with the same token (``server.same``) or a new one each time;
    ``server.pages`` counts the pages asked for."""

    def do_GET(self) -> None:
        self.server.pages += 1  # type: ignore[attr-defined]
        token = b"again" if self.server.same else str(self.server.pages).encode()  # type: ignore[attr-defined]
        body = (
            b"<ListBucketResult><Contents><Key>k</Key><Size>1</Size><ETag>e</ETag></Contents>"
            b"<IsTruncated>true</IsTruncated>"
            b"<NextContinuationToken>" + token + b"</NextContinuationToken></ListBucketResult>"
        )
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def endless(same: bool) -> Iterator[tuple[s3.Store, http.server.ThreadingHTTPServer]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Paging)
    server.pages, server.same = 0, same  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield s3.Store(f"http://127.0.0.1:{server.server_port}", "us-east-1"), server
    finally:
        server.shutdown()
        server.server_close()


def test_a_listing_that_gives_a_token_twice_is_refused() -> None:
    twice = "gave the listing's continuation token 'again' twice"
    with endless(same=True) as (store, server), pytest.raises(InputError, match=twice):
        s3.listing(store, "birds", "", "s3://birds")
    assert server.pages == 2  # type: ignore[attr-defined]


def test_a_listing_over_the_object_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "MAX_OBJECTS", 5)
    over = "s3://birds lists more than 5 objects: narrow"
    with endless(same=False) as (store, server), pytest.raises(InputError, match=over):
        s3.listing(store, "birds", "", "s3://birds")
    assert server.pages == 6  # type: ignore[attr-defined]


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
        # absolute: no bucket, or a prefix that starts with '/'
        "s3:///etc/passwd",
        "s3://birds//etc/passwd",
        # '..' and '.' anywhere in the prefix, plain or %-encoded in any case
        "s3://birds/..",
        "s3://birds/a/..",
        "s3://birds/a/.",
        "s3://birds/a/../b/",
        "s3://birds/%2e%2e/b",
        "s3://birds/a/%2E%2e/b",
        "s3://birds/a/.%2E/b",
        "s3://birds/a/%2e./b",
        # a backslash %-encoded, a NUL, control characters
        "s3://birds/a%5c..%5cb",
        "s3://birds/a%5C..%5Cb",
        "s3://birds/a%00b",
        "s3://birds/a\x01b",
        "s3://birds/a\x7f",
        # oversize: a prefix longer than any S3 key
        "s3://birds/" + "p" * 1025,
    ],
)
def test_s3_uris_that_name_no_bucket_or_leave_the_prefix_are_refused(uri: str) -> None:
    with pytest.raises(InputError):
        bucket_of(uri)
    with pytest.raises(InputError):
        parse(uri)


@pytest.mark.parametrize("uri", ["s3://birds/a\nb", "s3://birds/a b", "s3://birds/a\x00b"])
def test_s3_uris_with_white_space_or_a_nul_are_refused_by_the_parser(uri: str) -> None:
    with pytest.raises(InputError, match="may not hold a NUL byte or white space"):
        parse(uri)


@pytest.mark.parametrize(
    ("uri", "prefix"),
    [
        ("s3://birds/a/.../b", "a/.../b/"),  # '...' is a name, not a parent
        ("s3://birds/.hidden/x", ".hidden/x/"),
        ("s3://birds/x.", "x./"),
        ("s3://birds/" + "p" * 1024, "p" * 1024 + "/"),
    ],
)
def test_s3_prefixes_that_only_look_odd_are_kept(uri: str, prefix: str) -> None:
    assert bucket_of(uri) == ("birds", prefix)


def test_the_secret_is_part_of_an_s3_key() -> None:
    one = Source("s3://birds/train", secret="store-a")
    assert cache_key(one) != cache_key(Source("s3://birds/train", secret="store-b"))
    assert cache_key(one) != cache_key(
        Source("s3://birds/train", secret="store-a", include=("*.jpg",))
    )

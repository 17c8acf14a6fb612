"""The ``s3://<bucket>[/prefix]`` scheme: every object under a prefix of an S3-compatible store.

The store, the region and the credentials come from the environment, as the AWS tools
read them: ``AWS_ENDPOINT_URL`` (default ``https://s3.<region>.amazonaws.com``),
``AWS_REGION`` (or ``AWS_DEFAULT_REGION``, default us-east-1), ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` (none: the requests go unsigned, for a public bucket). In the
cluster they are the keys of the Secret the input names (``secretRef``), given to the
fetch Job only; in local mode, the shell's.

The fetch lists the prefix (ListObjectsV2, every page), keeps the keys the patterns
keep, refuses a key that would land outside the input's folder, and GETs each object
(path-style, signed with AWS Signature Version 4; ``WORKERS`` at once) into
``data/<key below the prefix>`` through a ``.part`` file resumed with a Range request;
a finished object is checked against its ETag (the MD5 of an object uploaded in one
part) and recorded in ``s3-done.json``, so a killed fetch does not fetch it again. The
resolved revision is the sha256 of the listing kept (key, size, ETag), written to
``revision`` for the cache entry. Standard library only; tested against AWS's
published signing examples and a real SeaweedFS S3 gateway in tests/unit/inputs/test_s3.py.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import hmac
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass

from torchyard.inputs import patterns, transfer
from torchyard.inputs.base import FetchPod, InputError, InputScheme, RegistryService, Source
from torchyard.inputs.cache import DATA, prune
from torchyard.variants import Rule

# A bucket name as S3 allows it (3-63 of a-z 0-9 . -), then an optional key prefix.
_BUCKET = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(.*))?$")
# An s3:// URI whose prefix could name a path outside the input's folder, or that a
# store would read otherwise than it is written: a '.' or '..' segment (plain or
# %-encoded), an empty segment (a leading '/' or '//'), a backslash (plain or %-encoded),
# a NUL or a control character. One rule for the CRD's CEL (RE2) and :func:`bucket_of`.
S3_PREFIX_REFUSED = (
    r"^s3://[^/]+/((.*/)?((\.|%2[eE]){1,2}(/.*)?|/.*)|.*(\\|%5[cC]|%00|[\x00-\x1f\x7f]).*)$"
)
S3_PREFIX_RULE = (
    "an s3:// prefix may not hold a '.', '..' or empty segment (nor start with '/'), plain "
    "or %-encoded, a backslash, a NUL or a control character"
)
# S3's longest key: a longer prefix names nothing.
S3_KEY_MAX_BYTES = 1024


def bucket_of(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of an s3:// URI, the prefix '' or ending in '/'; InputError
    when it is not one or the prefix has a '.', '..' or empty segment."""
    match = _BUCKET.match(uri)
    if match is None:
        raise InputError(
            f"{uri!r} is not an s3 input: write s3://<bucket>[/prefix], the bucket's name "
            "3 to 63 of a-z, 0-9, '.' and '-'"
        )
    prefix = match.group(3) or ""
    if re.match(S3_PREFIX_REFUSED, uri, re.DOTALL):
        raise InputError(
            f"{uri!r}: the prefix may not hold a '.', '..' or empty segment (nor start "
            "with '/'), plain or %-encoded, a backslash, a NUL or a control character"
        )
    if len(prefix.encode()) > S3_KEY_MAX_BYTES:
        raise InputError(
            f"{uri[:80]!r}...: the prefix is {len(prefix.encode())} bytes; an S3 key is at "
            f"most {S3_KEY_MAX_BYTES}"
        )
    return match.group(1), prefix.rstrip("/") + "/" if prefix.strip("/") else ""


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
DONE = "s3-done.json"
REVISION = "revision"
PARTS = "s3-parts"
WORKERS = 8  # objects fetched at once, as an S3 client's managed transfer does
# The keys an input's Secret must hold (its fetch Pod does not start without them), and
# those it may hold.
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
STORE_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
MAX_OBJECTS = 1_000_000  # a listing longer than this is refused, not held in memory
NAME_MAX = 255  # the longest file name the cache's file systems hold
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_ADVICE = {
    "InvalidAccessKeyId": "the access key is not one the store knows: check "
    "AWS_ACCESS_KEY_ID in the input's Secret",
    "SignatureDoesNotMatch": "the secret key does not match the access key: check "
    "AWS_SECRET_ACCESS_KEY in the input's Secret",
    "AccessDenied": "the credentials may not list or read this bucket: grant them "
    "s3:ListBucket and s3:GetObject",
    "NoSuchBucket": "the bucket does not exist: check the URI's bucket and the endpoint",
}


@dataclass(frozen=True)
class Store:
    """Where the objects are and who reads them."""

    endpoint: str
    region: str
    access_key: str = ""
    secret_key: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Store:
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
        return cls(
            (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/"),
            region,
            env.get("AWS_ACCESS_KEY_ID", ""),
            env.get("AWS_SECRET_ACCESS_KEY", ""),
        )


@dataclass(frozen=True)
class Object:
    key: str
    size: int
    etag: str


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def canonical_query(query: Mapping[str, str]) -> str:
    pairs = sorted((_quote(k), _quote(v)) for k, v in query.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


def signed_headers(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    region: str,
    service: str = "s3",
    when: datetime.datetime,
    payload_sha256: str = EMPTY_SHA256,
) -> dict[str, str]:
    """``headers`` with ``x-amz-date`` and the Signature Version 4 ``Authorization`` of
    the request; every header given is signed (the host is added)."""
    parts = urllib.parse.urlsplit(url)
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    out = {"host": parts.netloc, **{k.lower(): v for k, v in headers.items()}}
    out["x-amz-date"] = stamp
    names = sorted(out)
    canonical = "\n".join(
        [
            method,
            _quote(urllib.parse.unquote(parts.path or "/"), safe="/-_.~"),
            canonical_query(dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))),
            "".join(f"{n}:{' '.join(out[n].split())}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (stamp[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


def _headers(store: Store, url: str) -> dict[str, str]:
    headers = {"x-amz-content-sha256": EMPTY_SHA256}
    if not store.access_key:
        return headers
    return signed_headers(
        "GET",
        url,
        headers,
        access_key=store.access_key,
        secret_key=store.secret_key,
        region=store.region,
        when=datetime.datetime.now(datetime.timezone.utc),
    )


def error_of(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an S3 error document ('' when it is not one)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return "", ""
    return (root.findtext("Code") or "").strip(), (root.findtext("Message") or "").strip()


def _failed(uri: str, status: int, body: bytes) -> InputError:
    code, message = error_of(body)
    fix = _ADVICE.get(code) or transfer.advice(status)
    said = f"{code}: {message}" if message else code or "no S3 error code"
    return InputError(f"{uri}: S3 answered HTTP {status} ({said}): {fix}")


def _get(store: Store, url: str, uri: str) -> bytes:
    request = urllib.request.Request(url, headers=_headers(store, url))
    try:
        with urllib.request.urlopen(request, timeout=transfer.TIMEOUT_SECONDS) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as err:
        raise _failed(uri, err.code, err.read()) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise InputError(
            f"{uri}: cannot reach the S3 endpoint {store.endpoint} ({reason}): check "
            "AWS_ENDPOINT_URL, and that the fetch may reach it"
        ) from None


def parse_listing(body: bytes) -> tuple[list[Object], str]:
    """The objects of one ListObjectsV2 page, and the token of the next ('' at the end)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as err:
        raise InputError(f"the S3 listing is not XML ({err})") from None
    ns = _NS if root.tag.startswith(_NS) else ""
    found = []
    for item in root.iter(f"{ns}Contents"):
        size = item.findtext(f"{ns}Size") or "0"
        if not size.isdigit():
            raise InputError(f"the S3 listing gives a size that is not a number: {size!r}")
        etag = (item.findtext(f"{ns}ETag") or "").strip().strip('"')
        found.append(Object(item.findtext(f"{ns}Key") or "", int(size), etag))
    truncated = (root.findtext(f"{ns}IsTruncated") or "").strip().lower() == "true"
    token = (root.findtext(f"{ns}NextContinuationToken") or "").strip()
    if truncated and not token:
        raise InputError("the S3 listing is truncated but gives no continuation token")
    return found, token if truncated else ""


def listing(store: Store, bucket: str, prefix: str, uri: str) -> list[Object]:
    """Every object under ``prefix``, page after page; InputError when the store gives a
    page token twice (it would list for ever) or more than MAX_OBJECTS objects."""
    found: list[Object] = []
    token = ""
    seen: set[str] = set()
    while True:
        query = {"list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        url = f"{store.endpoint}/{_quote(bucket)}?{canonical_query(query)}"
        page, token = parse_listing(_get(store, url, uri))
        found += page
        if len(found) > MAX_OBJECTS:
            raise InputError(
                f"{uri} lists more than {MAX_OBJECTS} objects: narrow the prefix, or "
                "pack the objects into fewer"
            )
        if token in seen:
            raise InputError(
                f"{uri}: the store gave the listing's continuation token {token[:40]!r} "
                "twice, so the listing would not end: check the endpoint is an S3 store"
            )
        seen.add(token)
        if not token:
            return found


def relative(key: str, prefix: str) -> str:
    """The object's path below the prefix; InputError when it could land outside the
    input's folder (an absolute part, '.' or '..', plain or %-encoded, a backslash, a NUL
    or another control character, an empty part) or is longer than a key or a file name
    may be."""
    rel = key[len(prefix) :] if key.startswith(prefix) else ""
    parts = rel.split("/")
    bad = (
        not rel
        or re.search(r"[\x00-\x1f\x7f\\]", rel)
        or any(p in ("", ".", "..") for p in parts)
        or re.search(r"%2e|%2f|%5c|%00", rel, re.IGNORECASE)
        or rel[1:2] == ":"
    )
    if bad:
        raise InputError(
            f"the bucket holds key {key[:200]!r}, whose path below {prefix!r} would not "
            "stay inside the input's folder: rename the object or exclude it with the "
            "prefix or patterns"
        )
    if len(key.encode()) > S3_KEY_MAX_BYTES or any(len(p.encode()) > NAME_MAX for p in parts):
        raise InputError(
            f"the bucket lists key {key[:200]!r}..., longer than an S3 key "
            f"({S3_KEY_MAX_BYTES} bytes) or with a part longer than a file name "
            f"({NAME_MAX} bytes): rename the object or exclude it with the prefix or patterns"
        )
    return rel


def revision_of(objects: list[tuple[str, Object]]) -> str:
    blob = json.dumps([[o.key, o.size, o.etag] for _, o in objects], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def _kept(source: Source, objects: list[Object], prefix: str) -> list[tuple[str, Object]]:
    kept = []
    for obj in sorted(objects, key=lambda o: o.key):
        if obj.key.endswith("/") and obj.size == 0:
            continue  # a folder marker
        path = obj.key[len(prefix) :]
        if patterns.included(path, source.include, source.exclude):
            kept.append((relative(obj.key, prefix), obj))
    paths = {path for path, _ in kept}
    for path, obj in kept:
        folders = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
        clash = next((f for f in folders if f in paths), None)
        if clash is not None:
            raise InputError(
                f"the bucket holds both {prefix + clash!r} and {obj.key!r}: one path cannot be "
                "a file and a folder; exclude one of them with the patterns"
            )
    return kept


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load(path: str) -> dict[str, str]:
    try:
        with open(path) as f:
            return {str(k): str(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _object(store: Store, bucket: str, obj: Object, part: str, source: Source, cap: int) -> int:
    url = f"{store.endpoint}/{_quote(bucket)}/{_quote(obj.key, safe='/-_.~')}"
    shown = f"{source.uri} ({obj.key})"
    received = transfer.download(url, part, cap, _headers(store, url), shown=shown)
    size = os.path.getsize(part)
    single = re.fullmatch(r"[0-9a-f]{32}", obj.etag)
    if size != obj.size or (single and _md5(part) != obj.etag):
        os.unlink(part)  # a wrong object is never resumed
        raise InputError(
            f"{shown}: got {size} bytes that do not match the listing's size {obj.size} "
            f"and ETag {obj.etag}: the object changed while it was fetched; fetch again"
        )
    return received


def _objects(source: Source, store: Store) -> tuple[str, list[tuple[str, Object]]]:
    bucket, prefix = bucket_of(source.uri)
    return bucket, _kept(source, listing(store, bucket, prefix, source.uri), prefix)


def revision(source: Source, env: Mapping[str, str]) -> str:
    """The revision the store holds now: a digest of the kept listing's keys, sizes and ETags."""
    return revision_of(_objects(source, Store.from_env(env))[1])


def fetch(source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
    """Fill ``staging/data`` with the objects under the prefix; the bytes received."""
    store = Store.from_env(env)
    bucket, kept = _objects(source, store)
    total = sum(o.size for _, o in kept)
    if total > max_bytes:
        raise InputError(
            f"{source.uri} is {total} bytes, over the inputs cache's limit of {max_bytes} "
            "bytes: narrow it with include patterns or ask for a larger cache"
        )
    done_file = os.path.join(staging, DONE)
    done = _load(done_file)
    os.makedirs(os.path.join(staging, PARTS), exist_ok=True)
    wanted = [
        (path, obj)
        for path, obj in kept
        if not (done.get(obj.key) == obj.etag and os.path.isfile(os.path.join(staging, DATA, path)))
    ]  # the others are whole from a fetch that was killed after them
    received = 0

    def get(obj: Object) -> tuple[int, str]:
        part = os.path.join(staging, PARTS, hashlib.sha256(obj.key.encode()).hexdigest())
        return _object(store, bucket, obj, part, source, max_bytes), part

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {pool.submit(get, obj): (path, obj) for path, obj in wanted}
        try:
            for future in concurrent.futures.as_completed(futures):
                got, part = future.result()
                path, obj = futures[future]
                received += got
                target = os.path.join(staging, DATA, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(part, target)
                done[obj.key] = obj.etag
                _save(done_file, done)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    prune(os.path.join(staging, DATA), {path for path, _ in kept})
    with open(os.path.join(staging, REVISION), "w") as f:
        f.write(revision_of(kept))
    return received


def _save(path: str, done: Mapping[str, str]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(done, f)
    os.replace(path + ".tmp", path)


class S3Scheme(InputScheme):
    """``s3://``: the objects under a prefix, read with the input's Secret (part of the
    key); its listing is its revision (fetched again when it changed)."""

    TYPE = "s3"
    SUMMARY = (
        "s3://<bucket>[/prefix] (every object under the prefix of an S3-compatible store; "
        "see secretRef)"
    )
    FORM = "s3://<bucket>[/prefix]"
    PATTERN = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?"
    TAKES_SECRET = True
    RULES = (
        Rule(
            {
                "rule": "!self.uri.startsWith('s3://') || "
                f"!self.uri.matches(r'{S3_PREFIX_REFUSED}')",
                "message": S3_PREFIX_RULE,
                "fieldPath": ".uri",
                "reason": "FieldValueInvalid",
            },
            lambda i: (
                not i.uri.startswith("s3://") or not re.match(S3_PREFIX_REFUSED, i.uri, re.DOTALL)
            ),
        ),
    )

    def check(self, uri: str, sha256: str) -> None:
        bucket_of(uri)

    def fetch(self, source: Source, staging: str, env: Mapping[str, str], max_bytes: int) -> int:
        return fetch(source, staging, env, max_bytes)

    def current(self, source: Source, env: Mapping[str, str]) -> str:
        return revision(source, env)

    def key_parts(self, source: Source) -> dict[str, str]:
        return {"secret": source.secret}

    def fetch_pod(self, source: Source, namespace: str, registry: RegistryService) -> FetchPod:
        """The Secret's keys as the fetcher's variables, in this Pod only: the credentials
        required (the kubelet holds the Pod back, CreateContainerConfigError, when one is
        missing), the store's address and region optional."""
        if not source.secret:
            return FetchPod()
        required = [(key, False) for key in CREDENTIALS]
        optional = [(key, True) for key in STORE_KEYS]
        return FetchPod(
            env=tuple(
                {
                    "name": key,
                    "valueFrom": {
                        "secretKeyRef": {"name": source.secret, "key": key, "optional": maybe}
                    },
                }
                for key, maybe in required + optional
            )
        )

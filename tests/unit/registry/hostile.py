"""Hostile requests against the registry service, shared by the unit test (a stand-in
Authorizer, ``test_service.py``) and the integration test (TokenReview and
SubjectAccessReview, ``tests/integration/test_registry_service.py``).

:func:`plant` writes a secret into namespace ``b`` of a registry volume, a model of
namespace ``a`` and symbolic links from ``a`` into ``b``; :func:`cases` is the table: every
route, each of its path variables in turn replaced by ``..``, ``%2F``, ``%2e%2e``, absolute
paths, NUL bytes and overlong names, and requests that follow the planted links.
:func:`raw_request` sends a request line exactly as written (no client normalises it).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

SECRET = b"SECRET-OF-NAMESPACE-B-" + os.urandom(8).hex().encode()
OWN = b"weights of namespace a"
# The runs of namespace a whose archives a writer may touch (TrainingRuns in the cluster).
RUNS = ("own", "linked", "linkdir")
# The uids of the planted records (b's secret one, a's own one).
UID_B = "bbbbbbbb-0000-4000-8000-000000000000"
UID_A = "aaaaaaaa-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    body: bytes = b""
    why: str = ""


@dataclass
class Planted:
    root: Path
    a: str
    b: str
    sha_b: str  # the sha256 of b's snapshot (its content is SECRET)
    before: dict[str, bytes] = field(default_factory=dict)

    def outside_a(self) -> dict[str, bytes]:
        """Every file and link of the volume outside ``<root>/<a>``, with its content."""
        found: dict[str, bytes] = {}
        for path in sorted(self.root.parent.rglob("*")):
            if path.is_relative_to(self.root / self.a) or path.is_dir():
                continue
            link = path.is_symlink()
            found[str(path)] = b"-> " + os.readlink(path).encode() if link else path.read_bytes()
        return found


def _manifest(model: str, namespace: str, data: bytes) -> str:
    entry = {"path": "model.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return json.dumps({"model": model, "namespace": namespace, "version": 1, "files": [entry]})


def _summary(namespace: str, uid: str) -> bytes:
    name = "own" if uid == UID_A else "secret"
    return json.dumps(
        {"namespace": namespace, "name": name, "uid": uid, "phase": "Failed"}
    ).encode()


def plant(root: Path, a: str, b: str, linked_uid: str = "uid-linked") -> Planted:
    """b's secret (a run archive, a model version, a snapshot); a's own model; links from
    a's runs, models and snapshots into b. ``linked_uid``: the uid of a's run ``linked``,
    whose archive (with a link in it) it owns."""
    sha_b = hashlib.sha256(SECRET).hexdigest()
    files = {
        f"{b}/runs/secret/outputs/model.pt": SECRET,
        f"{b}/runs/secret/logs/node-0/log.txt": SECRET,
        f"{b}/models/secret/1/model.pt": SECRET,
        f"{b}/models/secret/1/manifest.json": _manifest("secret", b, SECRET).encode(),
        f"{b}/snapshots/{sha_b}.tar.gz": SECRET,
        f"{a}/runs/own/outputs/model.pt": OWN,
        f"{a}/runs/linked/outputs/notes.txt": b"mine",
        # the archive is run linked's own (run_owner): its link is refused, not moved aside
        f"{a}/runs/linked@owner": linked_uid.encode(),
        f"{a}/models/own/1/model.pt": OWN,
        f"{a}/models/own/1/manifest.json": _manifest("own", a, OWN).encode(),
        f"{a}/models/m/1/manifest.json": _manifest("m", a, SECRET).encode(),
        f"{b}/records/trainingruns/secret/{UID_B}/record.json": SECRET,
        f"{b}/records/trainingruns/secret/{UID_B}/summary.json": _summary(b, UID_B),
        f"{b}/records/trainingruns/secret/{UID_B}/metrics.jsonl": SECRET,
        f"{a}/records/trainingruns/own/{UID_A}/record.json": b'{"name": "own"}',
        f"{a}/records/trainingruns/own/{UID_A}/summary.json": _summary(a, UID_A),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    links = {
        f"{a}/runs/linked/outputs/model.pt": root / b / "runs/secret/outputs/model.pt",
        f"{a}/runs/linkdir": root / b / "runs/secret",
        # looks like run linked's archive moved aside (run_owner): a link, never read
        f"{a}/runs/linked@{UID_B}": root / b / "runs/secret",
        f"{a}/models/linked": root / b / "models/secret",
        f"{a}/models/m/1/model.pt": root / b / "models/secret/1/model.pt",
        f"{a}/snapshots/{sha_b}.tar.gz": root / b / f"snapshots/{sha_b}.tar.gz",
        f"{a}/records/sweeps": root / b / "records/trainingruns",
        f"{a}/records/trainingruns/linkdir": root / b / "records/trainingruns/secret",
        f"{a}/records/trainingruns/linked/{UID_B}": root
        / b
        / f"records/trainingruns/secret/{UID_B}",
        f"{a}/records/trainingruns/own/{UID_B}": root / b / f"records/trainingruns/secret/{UID_B}",
    }
    for name, target in links.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(target)
    planted = Planted(root, a, b, sha_b)
    planted.before = planted.outside_a()
    return planted


ROUTES = (
    ("GET", "/v1/namespaces/{ns}/runs/{run}"),
    ("PUT", "/v1/namespaces/{ns}/runs/{run}/{kind}/{path}"),
    ("POST", "/v1/namespaces/{ns}/runs/{run}/{kind}/{path}?upload=0"),
    ("GET", "/v1/namespaces/{ns}/runs/{run}/{kind}/{path}"),
    ("POST", "/v1/namespaces/{ns}/models/{model}/versions"),
    ("GET", "/v1/namespaces/{ns}/models"),
    ("GET", "/v1/namespaces/{ns}/models/{model}/versions/{v}"),
    ("GET", "/v1/namespaces/{ns}/models/{model}/versions/{v}/files/{path}"),
    ("PUT", "/v1/namespaces/{ns}/snapshots/{sha}"),
    ("GET", "/v1/namespaces/{ns}/snapshots/{sha}"),
    ("HEAD", "/v1/namespaces/{ns}/snapshots/{sha}"),
    ("GET", "/v1/namespaces/{ns}/records/{kinds}"),
    ("GET", "/v1/namespaces/{ns}/records/{kinds}/{name}"),
    ("PUT", "/v1/namespaces/{ns}/records/{kinds}/{name}/{uid}"),
    ("GET", "/v1/namespaces/{ns}/records/{kinds}/{name}/{uid}"),
    ("GET", "/v1/namespaces/{ns}/records/{kinds}/{name}/{uid}/metrics"),
)


def _hostile(variable: str, p: Planted) -> list[str]:
    """Values of one path variable, as written on the request line (percent-encoded)."""
    b, up = p.b, "..%2F" * 4  # <root>/<a>/runs/<run>/<kind>/ and .../models/<m>/<v>/
    absolute = "%2F" + "%2F".join((p.root / b).parts[1:])
    traversal = ["..", "%2e%2e", "%2E%2E", ".", "%00", "x%00y", "%2F", "%5C"]
    names = {
        "ns": [f"{p.a}%2F..%2F{b}", f"..%2F{b}", absolute, p.a + "x" * 60, f"{b}%00"],
        "run": [f"..%2F..%2F{b}%2Fruns%2Fsecret", f"{absolute}%2Fruns%2Fsecret", "r" * 64],
        "model": [f"..%2F..%2F{b}%2Fmodels%2Fsecret", f"{absolute}%2Fmodels%2Fsecret"],
        "v": ["0", "01", "-1", "9" * 12, f"1%2F..%2F..%2F..%2F{b}%2Fmodels%2Fsecret%2F1"],
        "kind": [f"outputs%2F..%2F..%2F..%2F..%2F{b}%2Fruns%2Fsecret%2Foutputs", "secret"],
        "path": [
            f"{up}{b}%2Fruns%2Fsecret%2Foutputs%2Fmodel.pt",
            f"{up}{b}%2Fmodels%2Fsecret%2F1%2Fmodel.pt",
            f"%2e%2e/%2e%2e/%2e%2e/%2e%2e/{b}/runs/secret/outputs/model.pt",
            f"%2E%2E%2F%2E%2E%2F%2E%2E%2F%2E%2E%2F{b}%2Fmodels%2Fsecret%2F1%2Fmodel.pt",
            f"{absolute}%2Fruns%2Fsecret%2Foutputs%2Fmodel.pt",
            f"{absolute}%2Fmodels%2Fsecret%2F1%2Fmodel.pt",
            "model.pt%00.txt",
            "a//model.pt",
            "..%5C..%5C..%5C..%5Cmodel.pt",
            ".tmp-upload-0",
            "x" * 300,
            "d/" * 600 + "model.pt",
        ],
        "sha": [p.sha_b[:63], p.sha_b + "0", "..", "%2e%2e", p.sha_b.upper()],
        "kinds": [f"trainingruns%2F..%2F..%2F..%2F{b}%2Frecords%2Ftrainingruns", "models", "runs"],
        "name": [
            f"..%2F..%2F..%2F{b}%2Frecords%2Ftrainingruns%2Fsecret",
            f"{absolute}%2Frecords%2Ftrainingruns%2Fsecret",
            "n" * 254,
            "-secret",
            "Secret",
        ],
        "uid": [
            f"..%2F..%2F..%2F..%2F{b}%2Frecords%2Ftrainingruns%2Fsecret%2F{UID_B}",
            UID_B.upper(),
            UID_B + "0",
            UID_B[:-1],
            f"{UID_B}%00",
        ],
    }
    return traversal + names[variable]


def cases(p: Planted) -> list[Case]:
    """The table: each route with each variable made hostile, and the planted links."""
    valid = {
        "ns": p.a,
        "run": "own",
        "kind": "outputs",
        "path": "model.pt",
        "model": "own",
        "v": "1",
        "sha": p.sha_b,
        "kinds": "trainingruns",
        "name": "own",
        "uid": UID_A,
    }
    table = []
    for method, template in ROUTES:
        variables = [v for v in valid if "{" + v + "}" in template]
        for variable in variables:
            for value in _hostile(variable, p):
                path = template.format(**{**valid, variable: value})
                body = b'{"run": "own"}' if template.endswith("/versions") else b"x"
                table.append(Case(method, path, body, f"{variable}={value[:40]}"))
    # Promotion names its run and path in the body: the same rules hold there.
    promote = f"/v1/namespaces/{p.a}/models/stolen/versions"
    for run, path in (
        (f"../../{p.b}/runs/secret", "outputs"),
        ("own", f"../../../{p.b}/runs/secret/outputs"),
        ("own", str(p.root / p.b / "runs/secret/outputs")),
        ("own", "outputs/\x00"),
        ("linkdir", "outputs"),  # a link to b's run
        ("linked", "outputs"),  # a folder holding a link to b's file
        ("linked", "outputs/model.pt"),
    ):
        body = json.dumps({"run": run, "path": path}).encode()
        table.append(Case("POST", promote, body, f"promote {run} {path}"))
    a, sha = f"/v1/namespaces/{p.a}", p.sha_b
    table += _archive_uids(p)
    for method, path in (
        ("GET", f"{a}/runs/linked/outputs/model.pt"),
        ("GET", f"{a}/runs/linkdir/outputs/model.pt"),
        ("GET", f"{a}/runs/linkdir/logs/node-0/log.txt"),
        ("GET", f"{a}/runs/linkdir"),
        ("GET", f"{a}/models/linked/versions/1"),
        ("GET", f"{a}/models/linked/versions/1/files/model.pt"),
        ("GET", f"{a}/models/m/versions/1/files/model.pt"),
        ("GET", f"{a}/snapshots/{sha}"),
        ("HEAD", f"{a}/snapshots/{sha}"),
        ("PUT", f"{a}/snapshots/{sha}"),
        ("PUT", f"{a}/runs/linked/outputs/model.pt"),
        ("PUT", f"{a}/runs/linkdir/outputs/model.pt"),
        ("PUT", f"{a}/runs/linkdir/outputs/new.pt"),
        ("PUT", f"{a}/runs/linked/outputs/model.pt?commit=later"),
        ("GET", f"{a}/records/sweeps"),
        ("GET", f"{a}/records/sweeps/secret"),
        ("GET", f"{a}/records/sweeps/secret/{UID_B}"),
        ("GET", f"{a}/records/sweeps/secret/{UID_B}/metrics"),
        ("GET", f"{a}/records/trainingruns/linkdir"),
        ("GET", f"{a}/records/trainingruns/linkdir/{UID_B}"),
        ("GET", f"{a}/records/trainingruns/linkdir/{UID_B}/metrics"),
        ("GET", f"{a}/records/trainingruns/linked"),
        ("GET", f"{a}/records/trainingruns/linked/{UID_B}"),
        ("GET", f"{a}/records/trainingruns/own/{UID_B}"),
        ("GET", f"{a}/records/trainingruns/own/{UID_B}/metrics"),
    ):
        table.append(Case(method, path, SECRET if method == "PUT" else b"", "symbolic link"))
    return table


def _archive_uids(p: Planted) -> list[Case]:
    """A reader's ``?uid=`` (the archive of one run, wherever it is): traversal, the owner
    file's own suffix, and the planted link that looks like a moved archive."""
    b, a = p.b, f"/v1/namespaces/{p.a}/runs"
    values = [
        f"..%2F..%2F{b}%2Fruns%2Fsecret",
        f"..%2F..%2F..%2F{b}%2Fruns%2Fsecret",
        "%2F" + "%2F".join((p.root / b / "runs/secret").parts[1:]),
        "..",
        ".",
        "%2e%2e",
        "owner",
        "x%2Fy",
        "%5C",
        "%00",
        f"{UID_B}%00",
        "",
        "u" * 80,
        UID_B,  # runs/linked@<UID_B> is a link into b
    ]
    return [
        Case("GET", f"{a}/linked{route}?uid={value}", b"", f"uid={value[:40]}")
        for route in ("", "/outputs/model.pt", "/outputs/notes.txt")
        for value in values
    ]


def raw_request(
    host: str, port: int, case: Case, token: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """Send ``case`` with its request line byte for byte; (status, the whole response)."""
    lines = [
        f"{case.method} {case.path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Connection: close",
        f"Authorization: Bearer {token}",
        f"Content-Length: {len(case.body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(head + case.body)
        response = b""
        while chunk := conn.recv(1 << 16):
            response += chunk
    status = int(response.split(b" ", 2)[1])
    return status, response

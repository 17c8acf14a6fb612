"""The registry service's run-record routes, over HTTP on loopback with the stand-in
Authorizer of ``test_service.py``: only the operator writes, readers of the namespace
read, a name used again keeps both records, and bad queries and bodies are refused (the
hostile path table of ``hostile.py`` covers these routes too, in test_service.py)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.unit.registry import hostile
from tests.unit.registry.test_service import OPERATOR, USER, WRITER, A, B, Served, StandIn
from torchyard import records
from torchyard.records import reader
from torchyard.registry.client import RegistryClient
from torchyard.registry.service import Limits

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
UID1 = "11111111-0000-4000-8000-000000000000"
UID2 = "22222222-0000-4000-8000-000000000000"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    svc = Served(tmp_path / "registry", StandIn(), Limits())
    yield svc
    svc.stop()


def run_body(name: str, uid: str, created: str, phase: str = "Failed", **labels: str) -> Any:
    return {
        "apiVersion": "torchyard.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {
            "name": name,
            "namespace": A,
            "uid": uid,
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {"command": ["python", "train.py"], "environment": "pytorch"},
        "status": {
            "phase": phase,
            "completionTime": "2026-03-01T11:00:00Z",
            "failure": {"rank": 3, "node": 1, "class": "CudaOOM", "message": "Traceback"},
        },
    }


def record_of(name: str, uid: str, created: str, **kw: Any) -> records.Record:
    return records.trainingrun_record(run_body(name, uid, created, **kw), [], [], {}, NOW)


def client(served: Served, token: str = OPERATOR) -> RegistryClient:
    return RegistryClient(f"http://127.0.0.1:{served.port}", token)


def put(served: Served, record: Any, token: str = OPERATOR, ns: str = A) -> tuple[int, bytes]:
    path = f"/v1/namespaces/{ns}/records/trainingruns/{record['name']}/{record['uid']}"
    return served.call("PUT", path, token, json.dumps(record).encode())


def test_the_operator_writes_a_record_and_readers_of_the_namespace_read_it(
    served: Served,
) -> None:
    archive = served.root / A / "runs" / "birds" / "logs"
    for node in (1, 0):
        (archive / f"node-{node}").mkdir(parents=True)
        (archive / f"node-{node}" / "metrics.jsonl").write_text(f'{{"step": {node}, "loss": 1}}\n')
    record = record_of("birds", UID1, "2026-03-01T10:00:00Z")
    client(served).put_record(record)
    said = {"namespace": A, "kind": "TrainingRun", "name": "birds", "uid": UID1}
    code, body = put(served, record)  # again: the same place, no duplicate
    assert (code, json.loads(body)) == (201, said)
    reading = client(served, USER)
    assert reading.get_record(A, "birds") == record
    assert reading.get_record(A, "birds", UID1) == record
    assert reading.metrics_lines(A, "birds", UID1) == [
        '{"step": 0, "loss": 1}',
        '{"step": 1, "loss": 1}',
    ]
    page = reading.list_records(A)
    assert [(s["name"], s["uid"], s["failureClass"]) for s in page.items] == [
        ("birds", UID1, "CudaOOM")
    ]
    assert page.continue_token is None
    assert len(list((served.root / A / "records" / "trainingruns" / "birds").iterdir())) == 1


def test_only_the_operator_may_write_records(served: Served) -> None:
    record = record_of("birds", UID1, "2026-03-01T10:00:00Z")
    for token in (WRITER, USER):
        code, body = put(served, record, token)
        assert code == 403 and b"may not create runrecords in team-a" in body
    assert put(served, record, "not-a-token")[0] == 401
    assert put(served, {**record, "namespace": B}, ns=B)[0] == 403
    assert not (served.root / A / "records").exists()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"namespace": B}, b"must be its route's"),
        ({"uid": UID2}, b"must be its route's"),
        ({"name": "other"}, b"must be its route's"),
        ({"kind": "Sweep"}, b"must be its route's"),
    ],
)
def test_a_record_must_name_its_route(served: Served, change: dict[str, str], says: bytes) -> None:
    record = record_of("birds", UID1, "2026-03-01T10:00:00Z")
    path = f"/v1/namespaces/{A}/records/trainingruns/birds/{UID1}"
    code, body = served.call("PUT", path, OPERATOR, json.dumps({**record, **change}).encode())
    assert code == 400 and says in body
    assert not (served.root / A / "records" / "trainingruns" / "birds" / UID1).exists()


def test_a_record_that_is_not_json_or_too_large_is_refused(served: Served) -> None:
    path = f"/v1/namespaces/{A}/records/trainingruns/birds/{UID1}"
    assert served.call("PUT", path, OPERATOR, b"[1, 2")[0] == 400
    assert served.call("PUT", path, OPERATOR, b"[1, 2]")[0] == 400
    big = b'{"x": "' + b"x" * reader.MAX_RECORD_BYTES + b'"}'
    code, body = served.call("PUT", path, OPERATOR, big)
    assert code == 413 and b"at most" in body
    # Streamed without a length: cut at the limit all the same.
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    pieces = (big[i : i + (1 << 20)] for i in range(0, len(big), 1 << 20))
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    try:
        conn.request("PUT", path, body=pieces, headers=headers, encode_chunked=True)
        assert conn.getresponse().status == 413
    except ConnectionResetError:  # (the service may close before the client sent all)
        pass
    finally:
        conn.close()
    assert not (served.root / A / "records" / "trainingruns" / "birds" / UID1).exists()


def test_a_name_used_again_keeps_both_records_and_the_newest_is_the_default(
    served: Served,
) -> None:
    older = record_of("birds", UID1, "2026-03-01T09:00:00Z", phase="Failed")
    newer = record_of("birds", UID2, "2026-03-01T10:00:00Z", phase="Succeeded")
    client(served).put_record(newer)
    client(served).put_record(older)
    reading = client(served, USER)
    assert reading.get_record(A, "birds")["uid"] == UID2  # type: ignore[index]
    assert reading.get_record(A, "birds", UID1)["phase"] == "Failed"  # type: ignore[index]
    assert [s["uid"] for s in reading.list_records(A).items] == [UID2, UID1]
    assert reading.get_record(A, "never") is None


def test_listings_filter_and_page_newest_first(served: Served) -> None:
    writer = client(served)
    for i in range(7):
        uid = f"{i:08d}-0000-4000-8000-000000000000"
        phase = "Failed" if i % 2 else "Succeeded"
        labels = {"torchyard.dev/experiment": "birds" if i < 4 else "cats", "team": f"t{i % 3}"}
        writer.put_record(
            record_of(f"run-{i}", uid, f"2026-03-0{i + 1}T00:00:00Z", phase=phase, **labels)
        )
    reading = client(served, USER)
    names, token = [], None
    while True:
        page = reading.list_records(A, limit=3, continue_token=token)
        names += [s["name"] for s in page.items]
        token = page.continue_token
        if token is None:
            break
    assert names == [f"run-{i}" for i in reversed(range(7))]
    assert [s["name"] for s in reading.list_records(A, phase="Failed").items] == [
        "run-5",
        "run-3",
        "run-1",
    ]
    assert [
        s["name"] for s in reading.list_records(A, experiment="birds", phase="Failed").items
    ] == ["run-3", "run-1"]
    selected = reading.list_records(A, label_selector="team=t0,torchyard.dev/experiment!=birds")
    assert [s["name"] for s in selected.items] == ["run-6"]
    since = reading.list_records(A, since=datetime(2026, 3, 6, tzinfo=timezone.utc))
    assert [s["name"] for s in since.items] == ["run-6", "run-5"]
    assert reading.list_records(A, kind="Sweep").items == []


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("limit=100000", b"limit: 100000 is not between 1 and 500"),
        ("limit=0", b"limit: 0"),
        ("limit=ten", b"is not a number"),
        ("since=yesterday", b"since:"),
        ("labelSelector=a%3D%3Db%3Dc", b"labelSelector"),
        ("labelSelector=%3Cscript%3E", b"labelSelector"),
        ("labelSelector=" + "a" * 1100, b"longer than 1024"),
        ("phase=%3Cscript%3Ealert(1)%3C%2Fscript%3E", b"phase:"),
        ("experiment=..%2F..%2Fteam-b", b"experiment:"),
        ("continue=not-a-token", b"continue:"),
        ("continue=WyJhIl0", b"continue:"),
    ],
)
def test_a_bad_query_is_refused_naming_its_part(served: Served, query: str, says: bytes) -> None:
    code, body = served.call("GET", f"/v1/namespaces/{A}/records/trainingruns?{query}", USER)
    assert code == 400 and says in body, body
    assert served.call("GET", f"/v1/namespaces/{B}/records/trainingruns?{query}", USER)[0] == 403


def test_the_records_of_a_namespace_never_list_anothers(served: Served) -> None:
    hostile.plant(served.root, A, B)
    page = client(served, USER).list_records(A)
    assert [(s["name"], s["uid"]) for s in page.items] == [("own", hostile.UID_A)]
    assert served.call("GET", f"/v1/namespaces/{B}/records/trainingruns", USER)[0] == 403

"""Where records live and how they are read: queries (filters, paging, their refusals),
and the folder tree (one folder per uid, replaced whole, nothing followed out of the
namespace)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from torchyard import records
from torchyard.records import index, reader
from torchyard.records.reader import BadQuery, FolderRecords, Query, Requirement

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def uid(i: int) -> str:
    return f"{i:08d}-0000-4000-8000-000000000000"


def record(name: str, i: int, created: str, phase: str = "Failed", **labels: str) -> Any:
    body = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid(i),
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {},
        "status": {"phase": phase},
    }
    return records.trainingrun_record(body, [], [], {}, NOW)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("a=b", (Requirement("a", "=", "b"),)),
        ("a==b, c!=d", (Requirement("a", "=", "b"), Requirement("c", "!=", "d"))),
        ("team,!stage", (Requirement("team", "exists"), Requirement("stage", "!exists"))),
        (
            "torchyard.dev/experiment=birds",
            (Requirement("torchyard.dev/experiment", "=", "birds"),),
        ),
        ("", ()),
    ],
)
def test_label_selectors_as_kubectl_takes_them(text: str, wanted: tuple[Requirement, ...]) -> None:
    assert reader.parse_selector(text) == wanted


@pytest.mark.parametrize(
    "text", ["a=b=c", "!a=b", "<script>", "a=<b>", "a b=c", "x" * 1025, "a=b,=c"]
)
def test_a_selector_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(BadQuery, match="labelSelector"):
        reader.parse_selector(text)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"kind": "Pods"}, "kind:"),
        ({"phase": "failed;drop"}, "phase:"),
        ({"experiment": "../b"}, "experiment:"),
        ({"limit": 501}, "limit: 501"),
        ({"limit": "-1"}, "limit: -1"),
        ({"since": "soon"}, "since:"),
        ({"continue_token": "%%%"}, "continue:"),
        ({"continue_token": "eyJhIjogMX0"}, "continue:"),  # {"a": 1}
    ],
)
def test_a_query_names_the_part_it_refuses(values: dict[str, Any], says: str) -> None:
    kind = values.pop("kind", "TrainingRun")
    with pytest.raises(BadQuery, match=says):
        Query.of(kind, **values)


def test_pages_follow_each_other_without_gaps_or_repeats_even_at_equal_times(
    tmp_path: Path,
) -> None:
    folder = FolderRecords(tmp_path)
    for i in range(11):
        folder.write(record(f"run-{i % 4}", i, f"2026-03-0{1 + i % 3}T00:00:00Z"))
    seen, token = [], None
    while True:
        page = folder.list_records("team-a", limit=4, continue_token=token)
        seen += [(s["created"], s["name"], s["uid"]) for s in page.items]
        token = page.continue_token
        if token is None:
            break
    assert sorted(u for _, _, u in seen) == sorted(uid(i) for i in range(11))
    assert seen == sorted(seen, reverse=True)  # newest first


def test_writing_a_uid_again_replaces_its_record_whole(tmp_path: Path) -> None:
    folder = FolderRecords(tmp_path)
    first = record("birds", 1, "2026-03-01T00:00:00Z", phase="Running")
    folder.write(first)
    folder.write({**first, "phase": "Failed"})
    assert [s["phase"] for s in folder.list_records("team-a").items] == ["Failed"]
    names = sorted(
        p.name for p in (tmp_path / "team-a" / "records" / "trainingruns" / "birds").iterdir()
    )
    assert names == [uid(1)]  # no temporary left behind


def test_metric_reports_come_from_the_archive_bounded_and_never_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "team-a" / "runs" / "birds"
    for node in range(2):
        (archive / "logs" / f"node-{node}").mkdir(parents=True)
        lines = "".join(json.dumps({"rank": node, "step": s}) + "\n" for s in range(3))
        (archive / "logs" / f"node-{node}" / "metrics.jsonl").write_text(lines)
    secret = tmp_path / "team-b" / "runs" / "x" / "logs" / "node-0"
    secret.mkdir(parents=True)
    (secret / "metrics.jsonl").write_text('{"secret": true}\n')
    (archive / "logs" / "node-2").symlink_to(secret)
    folder = FolderRecords(tmp_path)
    folder.write(record("birds", 1, "2026-03-01T00:00:00Z"), archive)
    lines = folder.metrics_lines("team-a", "birds", uid(1))
    assert [json.loads(x)["rank"] for x in lines] == [0, 0, 0, 1, 1, 1]
    # An archive outside the namespace is not read at all.
    folder.write(record("birds", 2, "2026-03-01T00:00:00Z"), tmp_path / "team-b" / "runs" / "x")
    assert folder.metrics_lines("team-a", "birds", uid(2)) == []
    # And the reports kept are bounded.
    monkeypatch.setattr(reader, "MAX_METRICS_BYTES", 50)
    folder.write(record("birds", 3, "2026-03-01T00:00:00Z"), archive)
    assert len(folder.metrics_lines("team-a", "birds", uid(3))) == 2


@pytest.mark.parametrize(
    ("namespace", "name", "uid_"),
    [("../team-b", "birds", None), ("team-a", "../x", None), ("team-a", "birds", "../../x")],
)
def test_names_that_are_not_names_are_refused(
    tmp_path: Path, namespace: str, name: str, uid_: str | None
) -> None:
    with pytest.raises(BadQuery):
        FolderRecords(tmp_path).get_record(namespace, name, uid_)


def test_nodes_whose_log_the_operator_could_not_read_get_their_archived_tail(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "team-a" / "runs" / "birds"
    for node in range(2):
        (archive / "logs" / f"node-{node}").mkdir(parents=True)
        text = "".join(f"node {node} line {i}\n" for i in range(500))
        (archive / "logs" / f"node-{node}" / "rank-0.txt").write_text(text)
    made = record("birds", 1, "2026-03-01T00:00:00Z")
    made["logTails"] = {"0": ["read from the Pod"]}
    folder = FolderRecords(tmp_path)
    folder.write(made, archive)
    tails = (folder.get_record("team-a", "birds") or {}).get("logTails") or {}
    assert tails["0"] == ["read from the Pod"]  # what the operator read stays
    assert len(tails["1"]) == records.build.TAIL_LINES
    assert tails["1"][-1] == "[rank 0] node 1 line 499"


def test_listings_read_the_index_and_only_what_was_appended_since(tmp_path: Path) -> None:
    folder = FolderRecords(tmp_path)
    for i in range(3):
        folder.write(record(f"run-{i}", i, f"2026-03-0{i + 1}T00:00:00Z"))
    kinds = tmp_path / "team-a" / "records" / "trainingruns"
    # The index alone is read: a summary.json changed behind its back is not.
    (kinds / "run-0" / uid(0) / "summary.json").write_text("{}")
    assert [s["name"] for s in folder.list_records("team-a").items] == ["run-2", "run-1", "run-0"]
    # A writer that stopped mid-line: the line waits for its end; a uid written again:
    # its last line wins.
    with (kinds / index.INDEX).open("a") as f:
        f.write('{"uid": "' + uid(9) + '", "name": "half"')
    folder.write({**record("run-1", 1, "2026-03-02T00:00:00Z"), "phase": "Succeeded"})
    page = folder.list_records("team-a")
    assert [(s["name"], s["phase"]) for s in page.items] == [
        ("run-2", "Failed"),
        ("run-1", "Succeeded"),
        ("run-0", "Failed"),
    ]
    # An index replaced (or cut short) is read again whole.
    (kinds / index.INDEX).write_text(json.dumps({"uid": uid(5), "name": "only"}) + "\n")
    assert [s["name"] for s in folder.list_records("team-a").items] == ["only"]


def test_an_index_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    other = tmp_path / "team-b" / "records" / "trainingruns"
    other.mkdir(parents=True)
    (other / index.INDEX).write_text(json.dumps({"uid": uid(1), "name": "secret"}) + "\n")
    mine = tmp_path / "team-a" / "records" / "trainingruns"
    mine.mkdir(parents=True)
    (mine / index.INDEX).symlink_to(other / index.INDEX)
    assert FolderRecords(tmp_path).list_records("team-a").items == []
    with pytest.raises(OSError):
        index.append(mine, {"uid": uid(2)})  # nor written through


def test_a_name_created_again_within_the_same_second_lists_the_later_record_first(
    tmp_path: Path,
) -> None:
    """Creation times have whole seconds (local runs a second apart share one): the time
    each record was written, to the microsecond, orders them, whatever their uids."""
    folder = FolderRecords(tmp_path)
    first, again = (
        record("birds", 9, "2026-03-01T00:00:00Z"),
        record("birds", 1, "2026-03-01T00:00:00Z"),
    )
    again["recorded"] = first["recorded"].replace(".000000Z", ".000001Z")
    for made in (first, again):
        folder.write(made)
    assert [s["uid"] for s in folder.list_records("team-a").items] == [uid(1), uid(9)]
    newest = folder.get_record("team-a", "birds")
    assert newest is not None and newest["uid"] == uid(1)

"""A run's outputs in the web view: its page (live, or a record of a run that is gone)
lists the files of its archive with their sizes, outputs first, each a download through
the registry under the caller's rights, beside the ModelVersion it made. A download
serves only a file the archive lists: a path that climbs out, is absolute, holds a
control character, is too long or names another run's or namespace's file is refused
before anything is read."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from yarl import URL

from tests.unit.web.fakes import SCRIPT, FakeSource, run
from tests.unit.web.test_records import GONE_UID, SECRET, call, source_with_records
from torchyard.web import recorded
from torchyard.web.source import Archive, ArchivedFile

MODEL = b"weights" * 1000
DONE_UID = "0b0b0b0b-0000-4000-8000-0000000000dd"
FILES = [
    ArchivedFile("outputs/model.pt", len(MODEL)),
    ArchivedFile(f"outputs/{SCRIPT}.txt", 3),
    ArchivedFile("logs/node-0/metrics.jsonl", 2),
]


def with_outputs(src: FakeSource, name: str) -> FakeSource:
    src.archives[name] = Archive(files=list(FILES))
    src.contents[(name, "outputs/model.pt")] = MODEL
    src.contents[(name, f"outputs/{SCRIPT}.txt")] = b"abc"
    src.contents[(name, "logs/node-0/metrics.jsonl")] = b"{}"
    return src


def live_source(tmp_path: Path) -> FakeSource:
    done = run("done", phase="Succeeded", status={"model": {"name": "birds", "version": 3}})
    done["metadata"]["uid"] = DONE_UID
    src = source_with_records(tmp_path)
    src.objects["team-a"].append(done)
    src.objects["team-b"] = [run(SECRET, ns="team-b")]
    src.contents[(SECRET, "outputs/model.pt")] = b"team-b's"
    return with_outputs(with_outputs(src, "done"), "gone")


async def _get(client: TestClient[Any, Any], url: str) -> tuple[int, str, Any]:
    # (as sent: the client normalizes neither ".." nor its percent-encoding away)
    response = await client.get(URL(url, encoded=True), allow_redirects=False)
    return response.status, (await response.read()).decode("utf-8", "replace"), response


def _files(page: str, ns: str, name: str) -> list[str]:
    start = page.index('id="files"')
    table = page[start : page.index("</table>", start)]
    return [h for h in table.split('href="')[1:] if h.startswith(f"/ns/{ns}/runs/{name}/")]


@pytest.mark.parametrize("name", ["done", "gone"])
def test_a_runs_page_lists_its_archive_with_sizes_and_downloads(tmp_path: Path, name: str) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        status, page, _ = await _get(client, f"/ns/team-a/runs/{name}")
        assert status == 200, page
        assert "Archived files (3)" in page
        links = [html.unescape(h.split('"')[0]) for h in _files(page, "team-a", name)]
        uid = f"?uid={DONE_UID if name == 'done' else GONE_UID}"  # this run's archive
        assert links == [
            f"/ns/team-a/runs/{name}/files/outputs/model.pt{uid}",
            f"/ns/team-a/runs/{name}/files/outputs/%3Cscript%3Ealert%28%22x%22%29%3C/script%3E.txt{uid}",
            f"/ns/team-a/runs/{name}/files/logs/node-0/metrics.jsonl{uid}",
        ]
        assert "6.8 KiB" in page and "3 B" in page  # the sizes
        assert "<script>alert" not in page
        status, got, response = await _get(client, links[0])
        assert (status, got.encode()) == (200, MODEL)
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert response.headers["Content-Length"] == str(len(MODEL))
        assert response.headers["Content-Disposition"] == "attachment; filename*=UTF-8''model.pt"
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        status, got, response = await _get(client, links[1])
        assert (status, got) == (200, "abc")
        assert response.headers["Content-Disposition"].endswith("''script%3E.txt")

    call(live_source(tmp_path), body)


def test_the_model_version_a_run_made_is_linked(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        _, page, _ = await _get(client, "/ns/team-a/runs/done")
        assert 'href="/ns/team-a/models#model-birds">birds version 3</a>' in page

    call(live_source(tmp_path), body)


def test_a_records_page_lists_the_archive_only_when_it_is_its_runs(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        url = f"/ns/team-a/runs/gone/records/{GONE_UID}"
        _, page, _ = await _get(client, url)
        assert len(_files(page, "team-a", "gone")) == 3  # gone's archive, gone's newest record
        again = run("gone", phase="Running")  # a new run of the same name writes there now
        again["metadata"]["uid"] = "0b0b0b0b-0000-4000-8000-0000000000aa"
        src.objects["team-a"].append(again)
        _, page, _ = await _get(client, url)
        assert 'id="files"' not in page
        assert "holds the live run of that name (uid 0b0b0b0b-0000-4000-8000-0000000000aa)" in page

    src = live_source(tmp_path)
    call(src, body)


def test_a_records_page_lists_its_own_runs_archive_where_the_registry_keeps_it(
    tmp_path: Path,
) -> None:
    """A later run of the name took the name's archive, and the registry moved the earlier
    one aside: the record asks for its uid's and lists it (the registry names its owner),
    with downloads of that uid's files."""

    async def body(client: TestClient[Any, Any]) -> None:
        _, page, _ = await _get(client, f"/ns/team-a/runs/gone/records/{GONE_UID}")
        links = [html.unescape(h.split('"')[0]) for h in _files(page, "team-a", "gone")]
        assert links == [f"/ns/team-a/runs/gone/files/outputs/old.pt?uid={GONE_UID}"]
        assert "holds the live run" not in page
        status, got, _ = await _get(client, links[0])
        assert (status, got) == (200, "old")
        assert src.archive_uids[-1] == GONE_UID

    src = live_source(tmp_path)
    again = run("gone", phase="Running")
    again["metadata"]["uid"] = "0b0b0b0b-0000-4000-8000-0000000000aa"
    src.objects["team-a"].append(again)
    old = Archive(files=[ArchivedFile("outputs/old.pt", 3)], owner=GONE_UID)
    src.archives[("gone", GONE_UID)] = old
    src.contents[("gone", "outputs/old.pt")] = b"old"
    call(src, body)


def test_without_a_registry_the_page_says_so(tmp_path: Path) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        status, page, _ = await _get(client, "/ns/team-a/runs/running")
        assert status == 200 and "archived files: no registry service configured" in page
        status, text, _ = await _get(client, "/ns/team-a/runs/running/files/outputs/model.pt")
        assert status == 404 and "has no file 'outputs/model.pt'" in html.unescape(text)

    call(source_with_records(tmp_path), body)


RUN = "/ns/team-a/runs/done/files/"
HOSTILE = [
    # encoded traversal, in every spelling
    (RUN + "..%2F..%2F..%2Fteam-b%2Fruns%2Fx%2Foutputs%2Fmodel.pt", 400, "'.' or '..' name"),
    (RUN + "outputs/..%2F..%2F" + SECRET + "%2Foutputs%2Fmodel.pt", 400, "'.' or '..' name"),
    (RUN + "outputs/%2e%2e/%2e%2e/etc/passwd", 400, "'.' or '..' name"),
    (RUN + "outputs/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", 400, "'.' or '..' name"),
    (RUN + "outputs%5C..%5C..%5Cetc%5Cpasswd", 400, "backslash"),
    # (a literal ./ or ../ is resolved before routing: the same file, another address)
    (RUN + "outputs/../../../../team-b/runs/x", 404, "no page at this address"),
    (RUN + "outputs/../../x", 405, "not allowed here"),
    # absolute paths
    (RUN + "%2Fetc%2Fpasswd", 400, "absolute"),
    (RUN + "%2Foutputs%2Fmodel.pt", 400, "absolute"),
    # control characters and the registry's own temporaries
    (RUN + "outputs/model.pt%00.txt", 400, "control character"),
    (RUN + "outputs/a%09b", 400, "control character"),
    (RUN + "outputs/a%0Ab", 404, "no page at this address"),  # (no route takes a newline)
    (RUN + "outputs/.tmp-upload-abc", 400, "registry's own"),
    # oversize: the whole path, one of its names
    (RUN + "outputs/" + "a/" * 600 + "b", 400, "longer than 1024"),
    (RUN + "outputs/" + "x" * 300, 400, "longer than 255"),
    # not a folder of the archive, not a file it lists
    (RUN + "checkpoints/step-1.pt", 400, "none of the archive's folders"),
    (RUN + "outputs/never-written.pt", 404, "has no file"),
    (RUN + "outputs", 404, "has no file 'outputs'"),
    # another run's file, another namespace's, a name that is not a name
    ("/ns/team-a/runs/running/files/outputs/model.pt", 404, "has no file"),
    (f"/ns/team-b/runs/{SECRET}/files/outputs/model.pt", 403, "forbidden"),
    ("/ns/team-a/runs/..%2Fteam-b/files/outputs/model.pt", 400, "not a run name"),
    ("/ns/..%2Fteam-b/runs/done/files/outputs/model.pt", 400, "not a namespace"),
    ("/ns/team-a/runs/" + "d" * 300 + "/files/outputs/model.pt", 400, "not a run name"),
    # nothing but the path (and the run's uid) is taken
    (RUN + "outputs/model.pt?path=..%2F..%2Fetc%2Fpasswd", 400, "unknown parameter"),
    (RUN + "outputs/model.pt?uid=..%2F..%2Fteam-b", 400, "not a uid"),
    (RUN + "outputs/model.pt?uid=owner", 400, "not a uid"),
    (RUN + "outputs/model.pt?uid=" + DONE_UID.upper(), 400, "not a uid"),
    (RUN + "outputs/model.pt?uid=" + DONE_UID + "%00", 400, "not a uid"),
    (RUN + f"outputs/model.pt?uid={DONE_UID}&uid={GONE_UID}", 400, "more than once"),
]


@pytest.mark.parametrize(("url", "status", "said"), HOSTILE)
def test_a_hostile_download_is_refused_and_reads_nothing(
    tmp_path: Path, url: str, status: int, said: str
) -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        got, text, response = await _get(client, url)
        assert got == status, text[:300]
        assert said.lower() in html.unescape(text).lower()
        assert "<script>alert" not in text
        assert "team-b's" not in text and SECRET not in text.replace(f"/{SECRET}", "")
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")

    call(live_source(tmp_path), body)


@pytest.mark.parametrize(
    ("live_uid", "newest_uid", "said"),
    [
        (None, None, ""),  # no live run, no newer record: its own archive
        (None, GONE_UID, ""),  # it is the newest record of its name
        (GONE_UID, None, ""),  # the live run is the recorded one (its Pods collected)
        ("u-live", None, "holds the live run of that name (uid u-live)"),
        (None, "u-later", "holds a later run of that name (uid u-later)"),
    ],
)
def test_whose_archive_a_record_shows(
    live_uid: str | None, newest_uid: str | None, said: str
) -> None:
    record: Any = {"uid": GONE_UID, "name": "gone"}
    why = recorded.archive_elsewhere(record, live_uid, newest_uid)
    assert (why == "") if not said else (said in why and "not this one's files" in why)

"""``sdk.tensorboard``: which names from a Pod or an archive are event files of the run
(never a path that leaves the folder, a link or a device), that a grown event file is
appended to in place, where a local run's event files are read from, and that a run that
ended without any says so."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from torchyard import records
from torchyard.api import wire
from torchyard.records import FolderRecords
from torchyard.sdk import tensorboard as tb
from torchyard.sdk.runs import RunNotFound

HOSTILE = [
    "/etc/passwd",
    "../escape",
    "a/../../escape",
    "./../escape",
    "a/b/../../../c",
    "..",
    "a\\..\\b",
    "line\nbreak",
    "nul\x00byte",
    "/".join(["d"] * (tb.MAX_DEPTH + 1)),
    "x" * (tb.MAX_PATH_CHARS + 1),
    "",
    ".",
    "./",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_a_path_inside_the_folder_is_refused(name: str) -> None:
    assert tb.checked(name) is None


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("./events.out.tfevents.1.host.1.0", "events.out.tfevents.1.host.1.0"),
        ("train/events.out.tfevents.2", "train/events.out.tfevents.2"),
        ("a//b/./c", "a/b/c"),
        ("with space/ev", "with space/ev"),
    ],
)
def test_a_relative_name_is_kept_as_its_plain_path(name: str, path: str) -> None:
    assert tb.checked(name) == path


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def member(name: str, type_: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.linkname = link
    return info


def test_only_plain_files_inside_the_folder_come_out_of_a_tar_stream() -> None:
    data = tar_of(
        (member("./ev.1"), b"event"),
        (member("./sub/ev.2"), b"more"),
        (member("../up"), b"x"),
        (member("/abs"), b"x"),
        (member("link", tarfile.SYMTYPE, "/etc/passwd"), b""),
        (member("hard", tarfile.LNKTYPE, "ev.1"), b""),
        (member("dev", tarfile.CHRTYPE), b""),
        (member("fifo", tarfile.FIFOTYPE), b""),
    )
    found, left = tb.untar(data, {})
    assert found == {"ev.1": b"event", "sub/ev.2": b"more"}
    assert sorted(left) == ["../up", "/abs", "dev", "fifo", "hard", "link"]


def test_a_file_of_the_size_already_had_is_not_read_again() -> None:
    data = tar_of((member("ev.1"), b"event"), (member("ev.2"), b"grown"))
    found, _ = tb.untar(data, {"ev.1": 5, "ev.2": 3})
    assert found == {"ev.2": b"grown"}


def test_a_stream_that_is_not_a_tar_is_an_error() -> None:
    with pytest.raises(OSError, match="tar stream"):
        tb.untar(b"sh: tar: not found" * 40, {})


def test_a_grown_event_file_is_appended_to_in_place(tmp_path: Path) -> None:
    tb.write(tmp_path, "run/ev", b"abc")
    path = tmp_path / "run" / "ev"
    inode = path.stat().st_ino
    with path.open("rb") as reader:  # as TensorBoard holds it
        assert reader.read() == b"abc"
        tb.write(tmp_path, "run/ev", b"abcdef")
        assert reader.read() == b"def"
    assert path.stat().st_ino == inode
    tb.write(tmp_path, "run/ev", b"xy")  # not its start: written anew
    assert path.read_bytes() == b"xy"


def test_nothing_is_written_through_a_link_in_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "sub").symlink_to(outside)
    with pytest.raises(OSError, match="is a link"):
        tb.write(root, "sub/ev", b"x")
    (root / "ev").symlink_to(outside / "target")
    with pytest.raises(OSError):
        tb.write(root, "ev", b"x")
    assert list(outside.iterdir()) == []


def test_a_folder_source_reads_plain_files_and_leaves_links_out(tmp_path: Path) -> None:
    folder = tmp_path / "tb"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "ev").write_bytes(b"1234")
    (folder / "secret").symlink_to("/etc/hostname")
    (folder / "dirlink").symlink_to(tmp_path)
    found, left = tb.FolderSource(folder, "here", False).read({})
    assert found == {"train/ev": b"1234"}
    assert "secret" in left
    assert tb.FolderSource(folder, "here", False).read({"train/ev": 4})[0] == {}


def workdir(workroot: Path, run: str, pid: int, stamp: str = "20261127-101010") -> Path:
    node0 = workroot / f"default-{run}-{stamp}-{pid}" / "node-0" / "outputs" / "tensorboard"
    node0.mkdir(parents=True)
    return node0


def test_a_running_local_run_is_read_from_its_folder_an_ended_one_from_the_archive(
    tmp_path: Path,
) -> None:
    registry, workroot = tmp_path / "registry", tmp_path / "runs"
    archive = registry / "default" / "runs" / "r" / "outputs" / "tensorboard"
    archive.mkdir(parents=True)
    live = workdir(workroot, "r", os.getpid())
    source = tb.local_source(registry, workroot, "default", "r")
    assert (source.live, getattr(source, "folder", None)) == (True, live)
    gone = 2**22 + 1  # above Linux's pid_max default: no such process
    os.utime(live.parents[2], (0, 0))
    workdir(workroot, "r", gone, "20261127-111111")
    source = tb.local_source(registry, workroot, "default", "r")
    assert (source.live, getattr(source, "folder", None)) == (False, archive)
    # another run's folders (a longer name with the same start) are not this run's
    workdir(workroot, "r-2", os.getpid())
    assert not tb.local_source(registry, workroot, "default", "r").live


def test_a_local_run_that_is_nowhere_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="no local run default/nope"):
        tb.local_source(tmp_path / "registry", tmp_path / "runs", "default", "nope")


def test_a_local_sweeps_trials_are_its_archived_runs_and_folders_in_order(tmp_path: Path) -> None:
    registry, workroot = tmp_path / "registry", tmp_path / "runs"
    for run in ("tiny-t0", "tiny-t10", "tiny-tx", "tinyer-t1", "other"):
        (registry / "default" / "runs" / run).mkdir(parents=True)
    workdir(workroot, "tiny-t2", 1)
    assert tb.local_trials(registry, workroot, "default", "tiny") == [
        "tiny-t0",
        "tiny-t2",
        "tiny-t10",
    ]


def test_an_ended_run_without_event_files_says_where_they_go(tmp_path: Path) -> None:
    empty = tb.FolderSource(tmp_path / "none", "the local archive", False)
    session = tb.Session(["r"], lambda _: empty, tb.Mirror(tmp_path / "kept"))
    live, said = session.step()
    assert not live and said == ["r: event files from the local archive"]
    with pytest.raises(tb.NoEventFiles, match=r"TORCHYARD_TENSORBOARD_DIR"):
        session.check_found(live)


def test_a_sweeps_trials_are_a_subfolder_each(tmp_path: Path) -> None:
    sources = {}
    for trial in ("s-t0", "s-t1"):
        (tmp_path / trial).mkdir()
        (tmp_path / trial / "ev").write_bytes(trial.encode())
        sources[trial] = tb.FolderSource(tmp_path / trial, trial, False)
    kept = tmp_path / "kept"
    session = tb.Session(["s-t0", "s-t1"], sources.__getitem__, tb.Mirror(kept))
    session.step()
    session.check_found(False)
    assert {p.relative_to(kept).as_posix(): p.read_bytes() for p in kept.rglob("ev")} == {
        "s-t0/ev": b"s-t0",
        "s-t1/ev": b"s-t1",
    }


def test_a_run_read_whole_from_a_source_that_ended_is_not_asked_again(tmp_path: Path) -> None:
    asked: list[str] = []
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "ev").write_bytes(b"x")

    def resolve(run: str) -> tb.Source:
        asked.append(run)
        return tb.FolderSource(tmp_path / "tb", "the archive", False)

    session = tb.Session(["r"], resolve, tb.Mirror(tmp_path / "kept"))
    assert session.step()[0] is False
    assert session.step() == (False, [])
    assert asked == ["r"]


def trial_record(name: str, i: int, created: str, **labels: str) -> records.Record:
    body = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"{i:08d}-0000-4000-8000-000000000000",
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {},
        "status": {"phase": "Succeeded"},
    }
    return records.trainingrun_record(body, [], [], {}, datetime.now(timezone.utc))


def test_a_sweeps_recorded_trials_are_its_own_on_every_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of trials whose TrainingRuns are gone: labelled with the Sweep's name and
    created since it was (an earlier Sweep of that name had its own), read page by page."""
    monkeypatch.setattr(tb, "MAX_LIMIT", 2)
    folder = FolderRecords(tmp_path)
    sweep = {wire.LABEL_SWEEP: "tune"}
    for i, (name, created, labels) in enumerate(
        [
            ("tune-t0", "2026-03-01T12:00:05Z", sweep),
            ("tune-t1", "2026-03-01T12:00:06Z", sweep),
            ("tune-t1", "2026-03-01T12:00:09Z", sweep),  # made again: one trial
            ("tune-t10", "2026-03-01T12:03:00Z", sweep),
            ("tune-t2", "2026-03-01T12:00:00Z", sweep),  # the second the Sweep was made
            ("tune-t3", "2026-03-01T11:59:59Z", sweep),  # the earlier Sweep's
            ("tune-t4", "2026-03-01T12:00:07Z", {}),  # a run of that name, no trial
            ("tuned-t0", "2026-03-01T12:00:07Z", {wire.LABEL_SWEEP: "tuned"}),
        ]
    ):
        folder.write(trial_record(name, i, created, **labels))
    found = tb.recorded_trials(folder, "team-a", "tune", "2026-03-01T12:00:00Z")
    assert found == ["tune-t0", "tune-t1", "tune-t10", "tune-t2"]
    assert tb.trial_order([*found, "tune-t1", "tune-t5"]) == [
        "tune-t0",
        "tune-t1",
        "tune-t2",
        "tune-t5",
        "tune-t10",
    ]
    assert tb.recorded_trials(folder, "team-b", "tune", None) == []


@pytest.mark.parametrize(
    ("outputs_var", "where"),
    [
        (True, "given/tensorboard"),  # $TORCHYARD_OUTPUTS, as the Pod's env says
        (False, "work/outputs/tensorboard"),  # ./outputs of the working directory
        (False, "tmp/torchyard/outputs/tensorboard"),  # the launcher's fallback
        (False, None),  # no event folder yet
    ],
)
def test_the_pods_tar_command_finds_the_event_folder_where_the_launcher_put_it(
    tmp_path: Path, outputs_var: bool, where: str | None
) -> None:
    """The copy's command runs in node 0's trainer container with its env and working
    directory; the launcher writes to $TORCHYARD_OUTPUTS, else ./outputs, else (a working
    directory it may not write) the same under the temporary directory."""
    (tmp_path / "work").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path / "tmp")}
    if outputs_var:
        env["TORCHYARD_OUTPUTS"] = str(tmp_path / "given")
    if where:
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "events.out.tfevents.1").write_bytes(b"ev")
    done = subprocess.run(
        tb.TAR_COMMAND, cwd=tmp_path / "work", env=env, capture_output=True, check=False
    )
    if where is None:
        assert done.returncode == tb.NO_FOLDER_EXIT
        return
    assert done.returncode == 0, done.stderr
    assert tb.untar(done.stdout, {}) == ({"events.out.tfevents.1": b"ev"}, [])

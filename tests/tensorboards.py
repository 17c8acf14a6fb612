"""What the TensorBoard tests share: the pinned TensorBoard venv (``make tensorboard``), a
script that writes scalars with TensorBoard's own writer step by step (it waits for the
test's go-ahead files, so that a test waits for what it expects instead of racing it), and
``torchyard tensorboard`` running as a user runs it, asked over TensorBoard's HTTP API."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.helpers import wait_for

LOCK = Path(__file__).parent / "integration" / "tracking" / "tensorboard.lock"
SCALARS = """\
import os, pathlib, sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
ctl = pathlib.Path(sys.argv[1])
writer = EventFileWriter(os.environ["TORCHYARD_TENSORBOARD_DIR"])
def log(step):
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                     summary=summary_pb2.Summary(value=[value])))
def after(name):
    writer.flush()
    while not (ctl / name).exists():
        time.sleep(0.05)
for step in range(3):
    log(step)
after("more")
for step in range(3, 6):
    log(step)
after("end")
writer.close()
"""

# The same scalars with no TensorBoard in the image (the node's PyTorch image has none):
# event files written with the standard library, records framed as TFRecord (masked
# CRC-32C) around Event protos encoded by hand. A step a second, ``argv[1]`` of them.
SCALARS_STDLIB = """\
import os, socket, struct, sys, time
def crc32c(data, table=[]):
    if not table:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
def varint(n):
    out = b""
    while n > 0x7F:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])
def key(num, wire):
    return varint(num << 3 | wire)
def text(num, data):
    return key(num, 2) + varint(len(data)) + data
def event(step, **scalar):
    body = key(1, 1) + struct.pack("<d", time.time()) + key(2, 0) + varint(step)
    if not scalar:
        return body + text(3, b"brain.Event:2")
    [(tag, value)] = scalar.items()
    value = text(1, tag.encode()) + key(2, 5) + struct.pack("<f", value)
    return body + text(5, text(1, value))
def record(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked(head)) + data + struct.pack("<I", masked(data))
folder = os.environ["TORCHYARD_TENSORBOARD_DIR"]
os.makedirs(folder, exist_ok=True)
name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
with open(os.path.join(folder, name), "ab") as out:
    out.write(record(event(0)))
    for step in range(int(sys.argv[1])):
        out.write(record(event(step, loss=1.0 / (step + 1))))
        out.flush()
        time.sleep(1)
"""


def venv() -> Path:
    """The venv ``make tensorboard`` installed (keyed by the lock's hash, as the Makefile)."""
    if os.environ.get("TORCHYARD_TENSORBOARD_VENV"):
        return Path(os.environ["TORCHYARD_TENSORBOARD_VENV"])
    cache = Path(os.environ.get("TORCHYARD_CACHE") or Path.home() / ".cache" / "torchyard")
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    return cache / f"tensorboard-venv-py{sys.version_info[0]}.{sys.version_info[1]}-{key}"


@pytest.fixture
def tensorboard_venv() -> Path:
    found = venv()
    assert (found / ".complete").exists(), f"no TensorBoard at {found}: run 'make tensorboard'"
    return found


class Served:
    """``torchyard tensorboard`` running: its output as it comes, and its URL."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def url(self) -> str:
        def served() -> str | None:
            for line in self.lines:
                if "serving http://" in line:
                    return line.split("serving ", 1)[1].split()[0]
            assert self.proc.poll() is None, self.output()
            return None

        found: str = wait_for("TensorBoard to serve", served, timeout=120)
        return found

    def steps(self, run: str, tag: str = "loss") -> list[int]:
        """The steps of ``tag`` TensorBoard shows for ``run`` (its scalars API)."""
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        try:
            with urllib.request.urlopen(
                f"{self.url()}/data/plugin/scalars/scalars?{query}", timeout=5
            ) as answer:
                return [int(point[1]) for point in json.loads(answer.read())]
        except urllib.error.HTTPError:  # not loaded yet: 400 (no such run or tag)
            return []


@contextmanager
def tensorboard(
    venv_: Path, folder: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[Served]:
    """``torchyard tensorboard ARGS`` with this venv's TensorBoard, keeping the event files
    in ``folder``; Ctrl-C at the end (it ends its TensorBoard)."""
    binary = str(venv_ / "bin" / "tensorboard")
    options = ["--folder", str(folder), "--tensorboard", binary, "--interval", "0.5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchyard", "tensorboard", *args, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=folder.parent,
        env={**os.environ, **(env or {})},
    )
    try:
        yield Served(proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)

"""The serving process itself (``python -m torchyard.serving``), as a serving Pod runs it:
a scoring script whose init() raises stops it with the runs' termination message (reason,
the exception's class, the script's traceback), and SIGTERM drains before it stops."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from torchyard.serving import contract

OPERATOR = Path(__file__).resolve().parents[3] / "operator"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    tmp_path: Path, script: str, port: int, *, python: list[str] | None = None, path: str = ""
) -> subprocess.Popen[str]:
    (tmp_path / "score.py").write_text(script)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": path or str(OPERATOR),
        contract.PORT_VARIABLE: str(port),
        contract.ENTRY_SCRIPT: "score.py",
        contract.MODEL_NAME: "birds",
        contract.MODEL_VERSION: "1",
        contract.DRAIN_SECONDS: "1.5",
        contract.TERMINATION_LOG: str(tmp_path / "termination-log"),
    }
    return subprocess.Popen(
        [*(python or [sys.executable]), "-m", "torchyard.serving"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def get(
    port: int, path: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def wait_ready(port: int, process: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            if get(port, contract.READY_PATH)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the serving process never got ready")


GOOD = "def init():\n    pass\ndef run(raw_data):\n    return {'ok': True}\n"


def test_init_raising_ends_the_process_with_the_runs_termination_message(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "def init():\n"
        "    path = os.path.join(os.environ.get('AZUREML_MODEL_DIR', '/models'), 'model.pt')\n"
        "    open(path)\n"
        "def run(raw_data):\n"
        "    return {}\n"
    )
    process = start(tmp_path, script, _port())
    out, _ = process.communicate(timeout=60)
    assert process.returncode == contract.INIT_FAILED_EXIT, out
    said = json.loads((tmp_path / "termination-log").read_text())
    assert said["reason"] == contract.INIT_FAILED and said["exitCode"] == contract.INIT_FAILED_EXIT
    assert said["exception"] == "FileNotFoundError"
    assert 'score.py", line 4, in init' in said["message"]
    assert said["message"].endswith("No such file or directory: '/models/model.pt'")
    assert "torchyard/serving" not in said["message"]
    assert "FileNotFoundError" in out  # and on the log (get_logs)


def test_sigterm_drains_with_connection_close_then_stops(tmp_path: Path) -> None:
    port = _port()
    process = start(tmp_path, GOOD, port)
    try:
        wait_ready(port, process)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        status, headers = get(port, contract.SCORE_PATH, "POST", b"{}")
        assert status == 200 and headers["connection"] == "close"
        assert get(port, contract.READY_PATH)[0] == 503
        out, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out
    assert "draining for 1.5 s" in out


def test_a_runtime_that_cannot_start_says_why(tmp_path: Path) -> None:
    """A Python without the server libraries (no site-packages, only torchyard's sources)."""
    process = start(tmp_path, GOOD, _port(), python=[sys.executable, "-S"], path=str(OPERATOR))
    out, _ = process.communicate(timeout=60)
    assert process.returncode == contract.RUNTIME_FAILED_EXIT, out
    said = json.loads((tmp_path / "termination-log").read_text())
    assert said["reason"] == contract.RUNTIME_FAILED
    assert said["exception"] == "ModuleNotFoundError" and "uvicorn" in said["message"]

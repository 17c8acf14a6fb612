"""The scoring script and its threads (torchyard.serving.scoring): the guide's init() and
run(raw_data), a run() that hangs timed out and counted as stuck, what JSON run() may
return, and the script's own frames of a traceback."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from torchyard.serving import scoring


def script(tmp_path: Path, body: str, name: str = "score.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_the_script_imports_its_neighbours_and_keeps_its_globals(tmp_path: Path) -> None:
    script(tmp_path, "FACTOR = 3\n", "helper.py")
    path = script(
        tmp_path,
        """
        import json
        from helper import FACTOR
        def init():
            global factor
            factor = FACTOR
        def run(raw):
            return [x * factor for x in json.loads(raw)["data"]]
        """,
        "neighbour_score.py",
    )
    scorer = scoring.Scorer(scoring.load(str(path)), 2)
    scorer.init()
    assert scorer.init_seconds is not None
    assert asyncio.run(scorer.run('{"data": [1, 2]}', 5)) == [3, 6]


@pytest.mark.parametrize(
    "body, said",
    [
        ("def run(raw): pass\n", "defines no init()"),
        ("def init(): pass\n", "defines no run(raw_data)"),
    ],
)
def test_a_script_without_init_or_run_is_refused(tmp_path: Path, body: str, said: str) -> None:
    with pytest.raises(scoring.ScriptError, match=said.split("(")[0]):
        scoring.load(str(script(tmp_path, body, "no_function_score.py")))


def test_a_missing_script_says_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(scoring.ScriptError, match="does not exist: check entryScript"):
        scoring.load(str(tmp_path / "nowhere.py"))


def test_a_hung_run_times_out_and_the_other_threads_still_answer(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        import threading
        release = threading.Event()
        def init(): pass
        def run(raw):
            if raw == "hang":
                release.wait(30)
            return raw
        """,
        "hang_score.py",
    )
    module = scoring.load(str(path))
    scorer = scoring.Scorer(module, 2)

    async def scenario() -> None:
        with pytest.raises(scoring.RunTimeout, match=r"longer than 0\.2 s"):
            await scorer.run("hang", 0.2)
        assert scorer.stuck == 1 and scorer.alive  # one of two threads is held
        assert await scorer.run("next", 5) == "next"
        with pytest.raises(scoring.RunTimeout):
            await scorer.run("hang", 0.2)
        assert scorer.stuck == 2 and not scorer.alive  # none left: the Pod is not alive
        # a request queued behind them times out without ever reaching run()
        with pytest.raises(scoring.RunTimeout):
            await scorer.run("queued", 0.2)
        assert scorer.stuck == 2
        module.release.set()
        for _ in range(100):
            if scorer.stuck == 0:
                break
            await asyncio.sleep(0.02)
        assert scorer.stuck == 0 and scorer.alive

    asyncio.run(scenario())


def test_what_run_returns_is_json_and_arrays_become_lists() -> None:
    class Array:
        def tolist(self) -> list[int]:
            return [1, 2]

    class Scalar:
        def item(self) -> float:
            return 0.5

    assert json.loads(scoring.encode({"a": Array(), "b": Scalar()})) == {"a": [1, 2], "b": 0.5}
    assert scoring.encode("text") == b'"text"'
    assert scoring.encode(b"\x00raw") == b"\x00raw"
    with pytest.raises(TypeError, match="run\\(\\) returned a object"):
        scoring.encode(object())


def test_a_traceback_shows_the_scripts_frames_not_the_runtimes(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        def init():
            open("/no/such/model.pt")
        def run(raw): pass
        """,
        "raising_score.py",
    )
    scorer = scoring.Scorer(scoring.load(str(path)), 1)
    with pytest.raises(FileNotFoundError) as raised:
        scorer.init()
    text = scoring.script_traceback(raised.value)
    assert "raising_score.py" in text and 'open("/no/such/model.pt")' in text
    assert "torchyard/serving/" not in text
    assert text.endswith("No such file or directory: '/no/such/model.pt'")

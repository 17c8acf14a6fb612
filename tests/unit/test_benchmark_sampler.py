"""benchmarks/sampler.py charges each thread's CPU time (Linux schedstat) to the stack it
is on, so that a window says where CPU went, not only which stacks were not waiting."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from benchmarks.sampler import Sampler


def burn_cpu(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(2000))


def wait_quietly(stop: threading.Event) -> None:
    stop.wait()


def test_cpu_is_charged_to_the_thread_that_used_it(tmp_path: Path) -> None:
    sampler = Sampler(str(tmp_path / "out.txt"), 0.005)
    stop = threading.Event()
    threads = [
        threading.Thread(target=burn_cpu, args=(stop,)),
        threading.Thread(target=wait_quietly, args=(stop,)),
    ]
    for thread in threads:
        thread.start()
    burner = "test_benchmark_sampler.py:burn_cpu"
    try:
        # until the burner was charged 50 ms (half a second on an idle machine; a busy one
        # gives it less CPU a second, so the time is not what is measured)
        deadline = time.monotonic() + 60
        while sampler.cpu_inclusive.get(burner, 0) < 50e6 and time.monotonic() < deadline:
            time.sleep(0.005)
            sampler.sample()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    burned = sampler.cpu_inclusive[burner]
    assert burned > 50e6  # ns
    assert sampler.cpu_inclusive["test_benchmark_sampler.py:wait_quietly"] < burned / 10
    sampler.dump()
    text = (tmp_path / "out.txt").read_text()
    assert "-- CPU inclusive (ms;" in text and "burn_cpu" in text.split("-- CPU inclusive")[1]

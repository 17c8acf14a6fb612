"""LTTB keeps a chart's shape in at most the points asked for."""

from __future__ import annotations

import math

import pytest

from torchyard.web.lttb import downsample


def test_few_points_come_back_as_they_are() -> None:
    points = [(float(i), float(i * i)) for i in range(10)]
    assert downsample(points, 10) == points
    assert downsample(points, 2) == points  # under 3 there is nothing to choose


@pytest.mark.parametrize("threshold", [3, 10, 2000])
def test_at_most_threshold_points_first_and_last_kept_in_order(threshold: int) -> None:
    points = [(float(i), math.sin(i / 50)) for i in range(100_000)]
    out = downsample(points, threshold)
    assert len(out) == threshold
    assert out[0] == points[0] and out[-1] == points[-1]
    assert [p[0] for p in out] == sorted(p[0] for p in out)
    assert set(out) <= set(points)


def test_a_spike_survives() -> None:
    points = [(float(i), 0.0) for i in range(10_000)]
    points[7_777] = (7_777.0, 100.0)
    assert (7_777.0, 100.0) in downsample(points, 50)

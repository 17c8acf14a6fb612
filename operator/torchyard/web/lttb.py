"""Largest-Triangle-Three-Buckets downsampling (Steinarsson, 2013): a metric's points cut
to at most ``threshold`` while keeping the shape a chart draws (peaks, dips, the first and
the last point).

Pure and standard library only. Called by the web view (``torchyard.web.views``) before a
metric is sent to the browser; tested in tests/unit/web/test_lttb.py.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]


def downsample(points: Sequence[Point], threshold: int) -> list[Point]:
    """``points`` (sorted by x) cut to ``threshold`` points; all of them when they are no
    more than that (or ``threshold`` < 3, which leaves nothing to choose)."""
    n = len(points)
    if threshold >= n or threshold < 3:
        return list(points)
    out = [points[0]]
    every = (n - 2) / (threshold - 2)  # the inner points' bucket size
    a = 0  # the point chosen in the previous bucket
    for i in range(threshold - 2):
        start, end = int(i * every) + 1, int((i + 1) * every) + 1
        # the next bucket's average: the third corner of every triangle in this one
        nxt_start, nxt_end = end, min(int((i + 2) * every) + 1, n)
        if nxt_start >= nxt_end:  # the last bucket: the last point is the third corner
            avg_x, avg_y = points[-1]
        else:
            span = nxt_end - nxt_start
            avg_x = sum(p[0] for p in points[nxt_start:nxt_end]) / span
            avg_y = sum(p[1] for p in points[nxt_start:nxt_end]) / span
        ax, ay = points[a]
        best, best_area = start, -1.0
        for j in range(start, end):
            x, y = points[j]
            area = abs((ax - avg_x) * (y - ay) - (ax - x) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        out.append(points[best])
        a = best
    out.append(points[-1])
    return out

"""Procedurally drawn training data, so the example needs no download.

- ``shapes(n)``: circles, squares, triangles and stars: the "related task" the backbone
  is pre-trained on (the guide starts from an ImageNet backbone; we cannot download one).
- ``birds(n)``: chicken and turkey silhouettes (the guide's two classes): a turkey has a
  big fanned tail, a long neck and a wattle; a chicken a small upright tail and a comb.

Every image is 3x32x32 float in [0, 1], with random size, position, mirroring,
colours and noise. The same seed gives the same images on every rank.
"""

from __future__ import annotations

import os

import numpy as np

SIZE = 32
SHAPES = ("circle", "square", "triangle", "star")
BIRDS = ("chicken", "turkey")


def _grid() -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    return (x + 0.5) / SIZE, (y + 0.5) / SIZE


def _ellipse(x, y, cx, cy, rx, ry, angle=0.0):
    c, s = np.cos(angle), np.sin(angle)
    dx, dy = x - cx, y - cy
    u, v = dx * c + dy * s, -dx * s + dy * c
    return (u / rx) ** 2 + (v / ry) ** 2 <= 1.0


def _polygon(x, y, points):
    """Points-in-polygon by the even-odd rule, vectorised over the grid."""
    inside = np.zeros_like(x, dtype=bool)
    n = len(points)
    for i in range(n):
        x1, y1 = points[i]
        x2, y2 = points[(i + 1) % n]
        cond = (y1 > y) != (y2 > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            xin = (x2 - x1) * (y - y1) / (y2 - y1 + 1e-12) + x1
        inside ^= cond & (x < xin)
    return inside


def _paint(mask, rng):
    bg = rng.uniform(0.55, 1.0, size=3).astype(np.float32)
    fg = rng.uniform(0.0, 0.45, size=3).astype(np.float32)
    img = np.where(mask[None], fg[:, None, None], bg[:, None, None])
    img = img + rng.normal(0, 0.06, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 1).astype(np.float32)


def _shape(kind, rng):
    x, y = _grid()
    cx, cy = rng.uniform(0.35, 0.65, size=2)
    r = rng.uniform(0.18, 0.3)
    rot = rng.uniform(0, 2 * np.pi)
    if kind == "circle":
        mask = _ellipse(x, y, cx, cy, r, r)
    elif kind == "square":
        pts = [
            (cx + r * np.cos(rot + k * np.pi / 2), cy + r * np.sin(rot + k * np.pi / 2))
            for k in range(4)
        ]
        mask = _polygon(x, y, pts)
    elif kind == "triangle":
        pts = [
            (cx + r * np.cos(rot + k * 2 * np.pi / 3), cy + r * np.sin(rot + k * 2 * np.pi / 3))
            for k in range(3)
        ]
        mask = _polygon(x, y, pts)
    else:
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else r * 0.45
            a = rot + k * np.pi / 5
            pts.append((cx + rr * np.cos(a), cy + rr * np.sin(a)))
        mask = _polygon(x, y, pts)
    return _paint(mask, rng)


def _bird(kind, rng):
    x, y = _grid()
    if rng.random() < 0.5:  # facing left or right
        x = 1.0 - x
    s = rng.uniform(0.8, 1.15)
    cx, cy = rng.uniform(0.42, 0.58), rng.uniform(0.5, 0.6)
    body = _ellipse(x, y, cx, cy, 0.2 * s, 0.14 * s, rng.uniform(-0.2, 0.2))
    legs = ((np.abs(x - (cx - 0.05 * s)) < 0.015) | (np.abs(x - (cx + 0.04 * s)) < 0.015)) & (
        (y > cy) & (y < cy + 0.26 * s)
    )
    if kind == "turkey":
        # A big fan of tail feathers behind the body, a long thin neck, a small head
        # with a hanging wattle.
        fan = _ellipse(x, y, cx - 0.16 * s, cy - 0.1 * s, 0.2 * s, 0.27 * s)
        rays = np.sin(np.arctan2(y - cy, x - (cx - 0.16 * s)) * 9) > -0.3
        neck = _ellipse(x, y, cx + 0.17 * s, cy - 0.14 * s, 0.03 * s, 0.12 * s, 0.3)
        head = _ellipse(x, y, cx + 0.21 * s, cy - 0.26 * s, 0.05 * s, 0.045 * s)
        wattle = _ellipse(x, y, cx + 0.25 * s, cy - 0.2 * s, 0.015 * s, 0.05 * s)
        mask = (fan & rays) | body | neck | head | wattle | legs
    else:
        # A rounder body, a short upright tail, a big head close to the body with a comb
        # on top and a beak.
        tail = _polygon(
            x,
            y,
            [
                (cx - 0.14 * s, cy - 0.02 * s),
                (cx - 0.27 * s, cy - 0.2 * s),
                (cx - 0.2 * s, cy + 0.02 * s),
            ],
        )
        head = _ellipse(x, y, cx + 0.15 * s, cy - 0.15 * s, 0.08 * s, 0.08 * s)
        comb = _ellipse(x, y, cx + 0.15 * s, cy - 0.25 * s, 0.06 * s, 0.035 * s)
        beak = _polygon(
            x,
            y,
            [
                (cx + 0.22 * s, cy - 0.17 * s),
                (cx + 0.3 * s, cy - 0.14 * s),
                (cx + 0.22 * s, cy - 0.11 * s),
            ],
        )
        mask = body | tail | head | comb | beak | legs
    return _paint(mask, rng)


def shapes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(SHAPES), size=n)
    images = np.stack([_shape(SHAPES[k], rng) for k in labels])
    return images, labels.astype(np.int64)


def birds(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(BIRDS), size=n)
    images = np.stack([_bird(BIRDS[k], rng) for k in labels])
    return images, labels.astype(np.int64)


def save(folder: str, n: int, seed: int = 1) -> str:
    """``n`` drawn birds as ``folder/birds.npz`` (``images``, ``labels``): a data set to
    hand a run as an input; the path written."""
    images, labels = birds(n, seed)
    path = os.path.join(folder, "birds.npz")
    np.savez_compressed(path, images=images, labels=labels)
    return path


def load(folder: str) -> tuple[np.ndarray, np.ndarray]:
    """The birds of ``folder/birds.npz`` (see :func:`save`)."""
    with np.load(os.path.join(folder, "birds.npz")) as data:
        return data["images"].astype(np.float32), data["labels"].astype(np.int64)

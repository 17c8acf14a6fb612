"""The documentation site's generated pages: the reference (``reference``) and the
benchmarks page (``benchmark_page``). ``python -m docs.gen`` (``make docs``) writes them
into docs/; ``python -m docs.gen --check`` only says which are stale (exit 1)."""

from __future__ import annotations


def pages() -> dict[str, str]:
    """Every generated page, ``{path under docs/: text}``."""
    from docs.gen import benchmark_page, reference

    return {**reference.pages(), benchmark_page.PATH: benchmark_page.page()}

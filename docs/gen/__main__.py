"""``python -m docs.gen [--check]``: write the generated pages into docs/ (or, with
``--check``, list those that differ from what would be written and exit 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from docs.gen import pages

DOCS = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args()
    stale = []
    wanted = pages()
    for name, text in sorted(wanted.items()):
        path = DOCS / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    # a generated page no generator makes any more
    for path in sorted((DOCS / "reference").glob("*.md")):
        name = path.relative_to(DOCS).as_posix()
        if name not in wanted:
            stale.append(name)
            if not args.check:
                path.unlink()
    for name in stale:
        print(f"docs/{name}: {'stale' if args.check else 'written'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

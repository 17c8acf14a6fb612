"""The documentation's benchmarks page, made from the results files the benchmark scripts
write (``benchmarks/results/<name>.json``, see ``benchmarks/record.py``): for each
benchmark, what it measures (its script's docstring), when and where the newest results
were measured (date, machine, load average, versions, commit, command), every summary
figure with its baseline, ratio and target, and every round. A benchmark with no results
file is listed with the command that makes one. No figure on the page is typed by hand.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from docs.gen.reference import cell, code, table

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
PATH = "benchmarks.md"
# The name a script records under: record.Record("name", ...) or, in a shell script,
# benchmarks/record.py <name>.
_PYTHON_NAME = re.compile(r"""record\.Record\(\s*["'](\w+)["']""")
_SHELL_NAME = re.compile(r"""record\.py"?\s+(\w+)""")


def scripts() -> dict[str, Path]:
    """``{results name: script}`` of every benchmark that writes a results file."""
    found: dict[str, Path] = {}
    for path in sorted(BENCHMARKS.rglob("*")):
        if path.suffix == ".py" and path.name != "record.py":
            names = _PYTHON_NAME.findall(path.read_text())
        elif path.suffix == ".sh":
            names = _SHELL_NAME.findall(path.read_text())
        else:
            continue
        for name in names:
            found.setdefault(name, path)
    return found


def about(path: Path) -> tuple[str, str]:
    """(title, first paragraph) of a script: its docstring, or a shell script's comment."""
    if path.suffix == ".py":
        text = ast.get_docstring(ast.parse(path.read_text())) or ""
    else:
        lines = []
        for line in path.read_text().splitlines()[1:]:
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").strip())
        text = "\n".join(lines)
    text = text.replace("``", "`")  # reStructuredText's inline code, as Markdown's
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        return path.name, ""
    lines = paragraphs[0].splitlines()
    # the title: the first line, and the next ones while the sentence goes on
    end = next((i for i, line in enumerate(lines) if line.rstrip().endswith((".", ":"))), 0)
    title = " ".join(" ".join(lines[: end + 1]).split()).rstrip(".:")
    body = " ".join(" ".join(lines[end + 1 :]).split())
    if not body and len(paragraphs) > 1:
        body = " ".join(paragraphs[1].split())
    return title, body


def needs(path: Path) -> str:
    """What a benchmark needs beyond this repository's venv, read from its source."""
    source = path.read_text()
    if path.suffix == ".sh":
        return "a machine with an NVIDIA GPU"
    if "operator_on_real_node" in source or "RealNode" in source:
        return "root and the real kubelet node (`tests/cluster/realnode.py`)"
    if "Cluster(" in source:
        return "the test control plane (`make tools`; `make peers` for the peers)"
    return ""


def command(path: Path) -> str:
    relative = path.relative_to(ROOT).as_posix()
    return f"bash {relative}" if path.suffix == ".sh" else f".venv/bin/python {relative}"


def number(value: Any) -> str:
    """A figure as the page shows it: 3 or 4 significant digits, counts as they are."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return cell(value)
    if isinstance(value, int):
        return str(value)
    size = abs(value)
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _with_unit(value: Any, unit: str) -> str:
    shown = number(value)
    return f"{shown} {cell(unit)}".strip() if unit else shown


def _spread(pair: Any) -> str:
    if not pair:
        return ""
    return f"{number(pair[0])}\N{EN DASH}{number(pair[1])}"


def _figure_row(figure: dict[str, Any]) -> list[str]:
    unit = figure.get("unit", "")
    baseline = figure.get("baseline")
    ratio = number(figure["ratio"]) if "ratio" in figure else ""
    if figure.get("ratio_spread"):
        ratio += f" ({_spread(figure['ratio_spread'])})"
    met = figure.get("met")
    target = cell(figure.get("target"))
    if met is not None:
        target += f" ({'met' if met else '**missed**'})"
    return [
        cell(figure["name"]),
        _with_unit(figure["value"], unit),
        _spread(figure.get("spread")),
        f"{cell(baseline['name'])}: {_with_unit(baseline['value'], unit)}" if baseline else "",
        ratio,
        target,
    ]


def _where(data: dict[str, Any]) -> str:
    machine = data.get("machine") or {}
    parts = []
    if machine.get("cpus"):
        parts.append(f"{machine['cpus']} CPUs ({cell(machine.get('cpu_model') or 'unknown')})")
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB memory")
    if machine.get("arch"):
        parts.append(f"{machine.get('system', '')} {machine.get('kernel', '')} {machine['arch']}")
    for gpu in machine.get("gpus") or []:
        parts.append(f"GPU {cell(gpu)}")
    return ", ".join(" ".join(p.split()) for p in parts)


def _load(data: dict[str, Any]) -> str:
    load = data.get("load_average") or {}

    def show(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values) if values else "unknown"

    return f"{show(load.get('start') or [])} at the start, {show(load.get('end') or [])} at the end"


def _versions(data: dict[str, Any]) -> str:
    versions = data.get("versions") or {}
    return ", ".join(f"{cell(k)} {cell(v)}" for k, v in versions.items() if v)


def _rounds(rounds: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for entry in rounds:
        keys += [k for k in entry if k not in keys]
    rows = [[number(entry.get(k, "")) if k in entry else "" for k in keys] for entry in rounds]
    return table([cell(k) for k in keys], rows)


def section(name: str, script: Path | None, data: dict[str, Any], tag: bool = False) -> str:
    """The page's section of results file ``name``; ``tag``: its title names the file
    (a script whose results files are more than one)."""
    title, body = about(script) if script else (name, "")
    if tag and script:
        title = f"{title} ({name})"
    out = [f"## {cell(title)}\n\n"]
    if script:
        out.append(f"`{script.relative_to(ROOT).as_posix()}`: {cell(body)}\n\n")
    commit = (data.get("git") or {}).get("commit")
    modified = (data.get("git") or {}).get("operator_modified")
    out.append(
        f"- **When**: {data['started']} to {data['finished']} (UTC)\n"
        f"- **Where**: {_where(data)}\n"
        f"- **Load average** (1 / 5 / 15 min): {_load(data)}\n"
        f"- **Versions**: {_versions(data)}\n"
        + (
            f"- **Commit**: `{commit}`"
            + (" (with changes to operator/ not committed)" if modified else "")
            + "\n"
            if commit
            else ""
        )
        + f"- **Command**: {code(data['command'])}\n"
        + f"- **Results file**: `benchmarks/results/{name}.json`\n"
    )
    for note in data.get("notes") or []:
        out.append(f"- **Note**: {cell(note)}\n")
    out.append("\n")
    if data.get("figures"):
        out.append(
            table(
                ["figure", "value", "spread", "baseline (same run)", "ratio", "target"],
                [_figure_row(f) for f in data["figures"]],
            )
            + "\n"
        )
    if data.get("rounds"):
        out.append(
            f'??? note "Every round ({len(data["rounds"])})"\n\n'
            + "".join(f"    {line}\n" for line in _rounds(data["rounds"]).splitlines())
            + "\n"
        )
    return "".join(out)


def page() -> str:
    known = scripts()
    results = {p.stem: p for p in sorted(RESULTS.glob("*.json"))}
    out = [
        "<!-- Generated by `make docs` (docs/gen/benchmark_page.py) from "
        "benchmarks/results/*.json: do not edit. -->\n\n",
        "# Benchmarks\n\n",
        "Every figure on this page comes from a results file a benchmark script wrote "
        "(`benchmarks/results/<name>.json`, through `benchmarks/record.py`): the newest run "
        "of each, with when and where it was measured. Each benchmark measures its baseline "
        "in the same run, rounds interleaved where it has rounds, and prints every round, "
        "the median and the spread (lowest to highest); a ratio is the figure over its "
        "baseline's. Timings depend on the machine and on what else it ran (its load "
        "average is recorded at the start and the end), so compare a figure with its "
        "baseline of the same run rather than with another run's.\n\n",
        "Run one again and the page follows: `make docs` regenerates it from the results "
        "files. `make bench BENCH_ARGS=--smoke` runs each at its smallest size without "
        "writing a file (as the test suite does).\n\n",
    ]
    datas = {name: json.loads(path.read_text()) for name, path in results.items()}
    # a second results file of one script (--results): the script its record names
    script_of = {n: known.get(n) or known.get(str(d.get("benchmark"))) for n, d in datas.items()}
    for name, data in datas.items():
        script = script_of[name]
        shared = sum(1 for other in script_of.values() if other == script) > 1
        out.append(section(name, script, data, tag=shared))
    missing = [(name, script) for name, script in known.items() if name not in results]
    if missing:
        out.append("## No results yet\n\n")
        out.append(
            "These benchmarks write a results file, but none is in the repository yet; the "
            "command makes one.\n\n"
        )
        rows = []
        for name, script in missing:
            title, _ = about(script)
            rows.append(
                [
                    cell(title),
                    code(command(script)),
                    needs(script),
                    f"`benchmarks/results/{name}.json`",
                ]
            )
        out.append(table(["benchmark", "command", "needs", "writes"], rows))
    return "".join(out).rstrip() + "\n"

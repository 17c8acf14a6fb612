"""``make mutants``: mutation testing of the guards, with a score per module.

mutmut (pinned in ``tests/mutants.lock``) changes one thing at a time in the modules below
(``<`` for ``<=``, ``and`` for ``or``, a string for another, a ``return True``, ...) and runs
the fast unit tests that reach the changed function; a change no test notices is a
*surviving* mutant. The modules are the pure ones a regression in would be a hole:
registry path and access checks, archive extraction, checkpoint completeness and
containment, admission's fit, the rank environment, the failure classes.

Each module is run with its own tests only (``MODULES``), in a scratch copy of the tree
under ``build/mutants/<module>/`` (mutmut reads its settings from ``pyproject.toml`` and
writes its mutants beside it), one or two workers at a time (``--workers``). A line whose
every mutant is equivalent (no behaviour could tell it apart) carries
``# pragma: no mutate`` with the reason beside it.

    python -m tests.mutants                      # every module
    python -m tests.mutants checkpoint rank      # these modules
    python -m tests.mutants --workers 2 --results build/mutants/scores.json

Prints each module's score (killed / mutants), the survivors' names (``mutmut show NAME``
in ``build/mutants/<module>/`` prints one), and exits 1 when a module is below
``--min-score`` (90 % unless told).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutants"


@dataclass(frozen=True)
class Module:
    source: str  # under operator/torchyard/
    tests: tuple[str, ...]  # under tests/unit/
    # tests of the module's source text (which mutmut rewrites), not of what it does
    deselect: tuple[str, ...] = ()
    # only these functions (``name`` or ``ǁClassǁmethod``, globs) when not all of the
    # module is a guard
    functions: tuple[str, ...] = ()

    def patterns(self) -> list[str]:
        """mutmut's names of the mutants to test (globs): ``torchyard.<module>.x_<function>``
        or ``.xǁ<Class>ǁ<method>``, then ``__mutmut_<N>``."""
        module = "torchyard." + self.source.removesuffix(".py").replace("/", ".")
        return [
            f"{module}.x{'' if function.startswith('ǁ') else '_'}{function}__mutmut_*"
            for function in self.functions
        ]


SOURCE_CHECK = (
    "tests/unit/checkpoint/test_checkpoint.py::"
    "test_the_module_parses_as_python_3_8_and_imports_only_the_standard_library"
)
# The registry's unit tests but test_layout.py (which reads the package's source files)
REGISTRY = tuple(
    f"registry/test_{name}.py"
    for name in (
        "store",
        "service",
        "client",
        "client_download",
        "receive_buffers",
        "auth",
        "tls_and_tokens",
    )
)
ONE_AUDIENCE = (
    "tests/unit/registry/test_tls_and_tokens.py::test_the_registry_audience_has_one_definition",
)
MODULES: dict[str, Module] = {
    "registry.store": Module("registry/store.py", REGISTRY, ONE_AUDIENCE),
    "registry.access": Module("registry/access.py", REGISTRY, ONE_AUDIENCE),
    "registry.archives": Module("registry/archives.py", REGISTRY, ONE_AUDIENCE),
    "checkpoint": Module(
        "checkpoint.py",
        ("checkpoint/test_checkpoint.py", "checkpoint/test_coordination.py"),
        (SOURCE_CHECK,),
    ),
    "checkpoint_store": Module(
        "checkpoint_store.py", ("checkpoint/test_checkpoint.py",), (SOURCE_CHECK,)
    ),
    "planning.admission": Module(
        "planning/admission.py",
        (
            "planning/test_admission.py",
            "planning/test_admission_scan.py",
            "planning/test_admission_fit.py",
            "planning/test_admission_queue.py",
            "planning/test_exclusions.py",
        ),
    ),
    "planning.rank": Module("planning/rank.py", ("planning/test_rank_env.py",)),
    "launch.classes": Module(
        "launch/classes.py", ("launcher/test_classes.py", "launcher/test_log_scanner.py")
    ),
    # its guard: unpacking a source snapshot (the uploads around it are tested end to end)
    "launch.node_files": Module(
        "launch/node_files.py",
        ("launcher/test_snapshot_extraction.py",),
        functions=("_member_kind", "_snapshot_target", "ǁ_Unpackerǁ*", "extract_snapshot"),
    ),
}

KILLED = {"killed", "timeout", "caught by type check", "segfault"}
STATUS = {  # mutmut's exit codes (mutmut.stats.status_by_exit_code)
    0: "survived",
    1: "killed",
    3: "killed",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "caught by type check",
    -11: "segfault",
    -9: "segfault",
}


def workspace(name: str, module: Module) -> Path:
    """A scratch copy of the package, the tests and pyproject.toml, with mutmut's settings."""
    where = WORK / name
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # mutmut names a mutant by its module, which it reads off the path under src/
    shutil.copytree(ROOT / "operator" / "torchyard", where / "src" / "torchyard", ignore=ignore)
    shutil.copytree(ROOT / "tests", where / "tests", ignore=ignore)
    settings = {
        "source_paths": ["src"],
        "only_mutate": [f"src/torchyard/{module.source}"],
        "pytest_add_cli_args_test_selection": [f"tests/unit/{t}" for t in module.tests],
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q"]
        + [arg for test in module.deselect for arg in ("--deselect", test)],
        "use_git_change_detection": False,
        "track_dependencies": False,
    }
    project = (ROOT / "pyproject.toml").read_text()
    project = project.replace('pythonpath = ["operator", "."]', 'pythonpath = ["src", "."]')
    lines = [project, "\n[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    (where / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return where


def verdicts(where: Path, module: Module) -> dict[str, str]:
    """Each mutant of the module and what became of it, from mutmut's ``.meta`` file."""
    meta = where / "mutants" / "src" / "torchyard" / f"{module.source}.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    patterns = module.patterns() or ["*"]
    return {
        key: STATUS.get(code, "suspicious")
        for key, code in sorted(codes.items())
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)
    }


def run(name: str, module: Module, workers: int, again: bool) -> dict[str, str]:
    if not again:  # the verdicts of the last run, as they are
        return verdicts(WORK / name, module)
    where = workspace(name, module)
    mutmut = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]
    print(f"[mutants] {name}: mutating operator/torchyard/{module.source}", flush=True)
    done = subprocess.run(
        [*mutmut, "run", "--max-children", str(workers), *module.patterns()],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"[mutants] mutmut failed on {name}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return verdicts(where, module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=", ".join(MODULES))
    parser.add_argument("--workers", type=int, default=1, help="mutants tested at once")
    parser.add_argument("--min-score", type=float, default=0.90)
    parser.add_argument("--results", type=Path, help="write the scores as JSON to this file")
    parser.add_argument(
        "--report", action="store_true", help="score the last run again without running it"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"no such module: {', '.join(unknown)} (one of {', '.join(MODULES)})")
    scores = {}
    for name in args.modules or MODULES:
        results = run(name, MODULES[name], args.workers, again=not args.report)
        counted = [status for status in results.values() if status != "skipped"]
        killed = sum(status in KILLED for status in counted)
        survivors = sorted(key for key, status in results.items() if status not in KILLED)
        score = killed / len(counted) if counted else 1.0
        scores[name] = {"killed": killed, "mutants": len(counted), "score": round(score, 4)}
        scores[name]["survivors"] = survivors
        print(f"[mutants] {name}: {killed}/{len(counted)} killed ({score:.1%})", flush=True)
        for key in survivors:
            print(f"    {results[key]:>10}  {key}")
    print("\n[mutants] score per module")
    for name, s in scores.items():
        mark = "" if s["score"] >= args.min_score else f"  < {args.min_score:.0%}"
        print(f"  {name:<20} {s['killed']:>4}/{s['mutants']:<4} {s['score']:.1%}{mark}")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(scores, indent=2) + "\n")
    return int(any(s["score"] < args.min_score for s in scores.values()))


if __name__ == "__main__":
    sys.exit(main())

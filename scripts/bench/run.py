"""Benchmark entry point: every available system, scenario by scenario, side by side.

    python scripts/bench/run.py [--repeat 5] [--quick] [--systems floor,langgraph,flowkernel]

Systems are modules in this folder (see ``SYSTEMS``) exporting the scenario functions

    s1(n: int) -> dict[str, float]            # chain of n nodes
    s2(branches: int = 50) -> dict[str, float]
    s3(steps: int = 200) -> dict[str, float]
    s4(iterations: int = 1000) -> dict[str, float]

each returning the figures of ONE repetition (keys listed in ``METRICS``; unknown extra keys
are shown too). A module that fails to import is reported as "NAME: not available (reason)"
and skipped; a missing scenario function or a scenario that raises leaves its cells empty.
The table shows the median over ``--repeat`` runs (repetitions interleave the systems),
plus ratios against the floor and LangGraph. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import platform
import sqlite3
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import measure
from measure import Metrics, ScenarioFn, Stopwatch, fmt_number, fmt_ratio

# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class SystemSpec:
    name: str
    module: str
    short: str  # column tag used in ratio headers


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec("floor", "floor", "floor"),
    SystemSpec("langgraph", "peers", "lg"),
    SystemSpec("flowkernel", "flowkernel_side", "fk"),
)
SCENARIO_FUNCS = ("s1", "s2", "s3", "s4")
HERE = Path(__file__).resolve().parent


@dataclass
class System:
    spec: SystemSpec
    module: ModuleType
    description: str
    funcs: dict[str, ScenarioFn]


def load_system(spec: SystemSpec) -> System | str:
    """The loaded system, or the reason it is not available."""
    if not (HERE / f"{spec.module}.py").exists() and not (HERE / spec.module).is_dir():
        return f"scripts/bench/{spec.module}.py not present"
    try:
        module = importlib.import_module(spec.module)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    funcs: dict[str, ScenarioFn] = {}
    for name in SCENARIO_FUNCS:
        fn = getattr(module, name, None)
        if callable(fn):
            funcs[name] = fn
    if not funcs:
        return f"module {spec.module} exports none of {', '.join(SCENARIO_FUNCS)}"
    describe = getattr(module, "describe", None)
    description = str(describe()) if callable(describe) else spec.module
    return System(spec, module, description, funcs)


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    ratio: bool = True


@dataclass(frozen=True)
class Case:
    scenario: str  # "S1".."S4"
    label: str
    func: str  # "s1".."s4"
    args: tuple[int, ...] = ()
    kwargs: dict[str, int] = field(default_factory=dict)


def metric_specs(case: Case) -> list[MetricSpec]:
    if case.func == "s1":
        return [
            MetricSpec("us_per_step", "us/step"),
            MetricSpec("total_ms", "total ms"),
            MetricSpec("db_bytes", "db+wal bytes after run"),
            MetricSpec("db_bytes_checkpointed", "db bytes after wal_checkpoint(TRUNCATE)"),
        ]
    if case.func == "s2":
        return [MetricSpec("us_per_node", "us/node (total / nodes)"), MetricSpec("total_ms", "total ms")]
    if case.func == "s3":
        return [
            MetricSpec("process_ms", "whole fresh process ms (spawn..exit)"),
            MetricSpec("inproc_ms", "in-process resume ms (after imports)"),
            MetricSpec("invoke_ms", "  of which the resume call ms"),
        ]
    iterations = case.kwargs.get("iterations", measure.S4_ITERATIONS)
    early, late = measure.s4_windows(iterations)
    return [
        MetricSpec(
            "bytes_per_transition_early",
            f"bytes/transition @ iter {measure.S4_EARLY_ITERATION} (iters {early.first}-{early.last})",
        ),
        MetricSpec(
            "bytes_per_transition_late",
            f"bytes/transition @ iter {iterations} (iters {late.first}-{late.last})",
        ),
        MetricSpec(
            "bytes_per_transition_late_steady",
            f"  same, iters {measure.s4_steady_window(iterations).first}-{measure.s4_steady_window(iterations).last}"
            " (without the run's final commit)",
        ),
        MetricSpec("us_per_transition", "us/transition"),
        MetricSpec("total_ms", "total ms"),
    ]


def plan(quick: bool) -> list[Case]:
    sizes = measure.S1_SIZES_QUICK if quick else measure.S1_SIZES
    iterations = measure.S4_ITERATIONS_QUICK if quick else measure.S4_ITERATIONS
    cases = [Case("S1", f"S1 chain N={n}", "s1", args=(n,)) for n in sizes]
    cases.append(
        Case("S2", f"S2 fan-out {measure.S2_BRANCHES} + join", "s2", kwargs={"branches": measure.S2_BRANCHES})
    )
    cases.append(
        Case("S3", f"S3 resume after {measure.S3_STEPS} steps", "s3", kwargs={"steps": measure.S3_STEPS})
    )
    cases.append(Case("S4", f"S4 3-node loop x{iterations}", "s4", kwargs={"iterations": iterations}))
    return cases


# --------------------------------------------------------------------------- running


@dataclass
class CellResult:
    samples: list[Metrics] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0

    def median(self, key: str) -> float | None:
        values = [s[key] for s in self.samples if key in s]
        if not values or len(values) != len(self.samples):
            return None
        return measure.median(values)

    def metric_keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for s in self.samples:
            seen.update(dict.fromkeys(s))
        return list(seen)


Results = dict[str, dict[str, CellResult]]  # case label -> system name -> cell


def call_scenario(system: System, case: Case) -> Metrics:
    fn = system.funcs[case.func]
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in case.kwargs.items() if takes_any or k in params}
    dropped = sorted(set(case.kwargs) - set(kwargs))
    if dropped:
        measure.progress(f"  warning: {system.spec.name}.{case.func} takes no {dropped}; using its default")
    result = fn(*case.args, **kwargs)
    return {k: float(v) for k, v in result.items()}


def run_case(case: Case, systems: Sequence[System], repeat: int, warmup: int) -> dict[str, CellResult]:
    cells = {s.spec.name: CellResult() for s in systems}
    active = [s for s in systems if case.func in s.funcs]
    for s in systems:
        if case.func not in s.funcs:
            cells[s.spec.name].error = f"no {case.func}()"
    total = warmup + repeat
    for rep in range(total):
        # rotate the order each repetition so no system always runs first
        order = active[rep % len(active) :] + active[: rep % len(active)] if active else []
        for system in order:
            cell = cells[system.spec.name]
            if cell.error is not None:
                continue
            tag = f"warm-up {rep + 1}/{warmup}" if rep < warmup else f"rep {rep - warmup + 1}/{repeat}"
            measure.progress(f"[{case.label}] {system.spec.name} {tag} ...")
            try:
                with Stopwatch() as sw:
                    metrics = call_scenario(system, case)
            except Exception as exc:
                cell.error = f"{type(exc).__name__}: {exc}"
                measure.progress(traceback.format_exc())
                continue
            cell.wall_s += sw.seconds
            if rep >= warmup:
                cell.samples.append(metrics)
            measure.progress(f"[{case.label}] {system.spec.name} {tag} done in {sw.seconds:.2f} s")
    return cells


# --------------------------------------------------------------------------- report


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def build_rows(
    cases: Sequence[Case], results: Results, systems: Sequence[System]
) -> tuple[list[str], list[list[str]], list[str]]:
    names = [s.spec.name for s in systems]
    have = set(names)
    ratio_cols: list[tuple[str, str]] = []
    if "langgraph" in have and "floor" in have:
        ratio_cols.append(("langgraph", "floor"))
    if "flowkernel" in have:
        ratio_cols += [("flowkernel", b) for b in ("floor", "langgraph") if b in have]
    short = {s.spec.name: s.spec.short for s in systems}
    headers = ["scenario", "metric (median)", *names, *(f"{short[a]}/{short[b]}" for a, b in ratio_cols)]
    rows: list[list[str]] = []
    notes: list[str] = []

    def add_row(
        scenario: str, label: str, values: dict[str, float | None], with_ratio: bool, exp: bool
    ) -> None:
        cells = [fmt_number(values.get(n), decimals=2 if exp else None) for n in names]
        ratios = [fmt_ratio(ratio(values.get(a), values.get(b))) if with_ratio else "" for a, b in ratio_cols]
        rows.append([scenario, label, *cells, *ratios])

    s1_cases = [c for c in cases if c.func == "s1"]
    for case in cases:
        cells = results[case.label]
        specs = metric_specs(case)
        known = {m.key for m in specs}
        extra = sorted({k for c in cells.values() for k in c.metric_keys()} - known)
        specs += [MetricSpec(k, k) for k in extra]
        first = True
        for m in specs:
            values = {n: cells[n].median(m.key) for n in names}
            if all(v is None for v in values.values()):
                continue
            add_row(case.label if first else "", m.label, values, m.ratio, False)
            first = False
        for n in names:
            if cells[n].error is not None:
                notes.append(f"{case.label} / {n}: {cells[n].error}")
        if case is s1_cases[-1] and len(s1_cases) >= 2:
            rows.append([])
            sizes = [float(c.args[0]) for c in s1_cases]
            for key, label in (
                ("total_ms", "growth exponent of total time vs N"),
                ("db_bytes_checkpointed", "growth exponent of checkpointed db bytes vs N"),
            ):
                exps: dict[str, float | None] = {}
                for n in names:
                    ys = [results[c.label][n].median(key) for c in s1_cases]
                    clean = [y for y in ys if y is not None and y > 0]
                    exps[n] = measure.growth_exponent(sizes, clean) if len(clean) == len(ys) else None
                add_row("S1 (log-log slope)" if key == "total_ms" else "", label, exps, False, True)
        rows.append([])
    return headers, rows, notes


def header_lines(
    systems: Sequence[System], missing: dict[str, str], args: argparse.Namespace, wall_s: float
) -> list[str]:
    tmp = os.environ.get("BENCH_TMPDIR") or tempfile.gettempdir()
    lines = [
        "flowkernel benchmark: durable transitions in SQLite (WAL, synchronous=FULL, fresh db per run)",
        f"python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, temp dbs under {tmp}",
        f"repeat={args.repeat} (median shown), warm-up runs={args.warmup}, quick={args.quick}, "
        f"benchmark wall time {wall_s:.1f} s",
    ]
    for s in systems:
        lines.append(f"  {s.spec.name}: {s.description}")
    for name, reason in missing.items():
        lines.append(f"  {name}: not available ({reason})")
    return lines


def wall_lines(cases: Sequence[Case], results: Results, systems: Sequence[System]) -> list[str]:
    out = ["wall time spent per scenario and system (all runs incl. warm-up and set-up), s:"]
    for case in cases:
        parts = [f"{s.spec.name} {results[case.label][s.spec.name].wall_s:.1f}" for s in systems]
        out.append(f"  {case.label}: " + ", ".join(parts))
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="measured runs per cell (default 5, quick 2)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="discarded runs per cell before measuring")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (S1 N=50,200; S4 x100)")
    parser.add_argument(
        "--systems",
        default=",".join(s.name for s in SYSTEMS),
        help="comma-separated subset of: " + ", ".join(s.name for s in SYSTEMS),
    )
    parser.add_argument("--json", type=Path, default=None, help="also write raw samples to this file")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 2 if args.quick else 5
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [n.strip() for n in args.systems.split(",") if n.strip()]
    by_name = {s.name: s for s in SYSTEMS}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        print(f"unknown system(s): {', '.join(unknown)}; known: {', '.join(by_name)}", file=sys.stderr)
        return 2

    measure.ensure_installed()
    systems: list[System] = []
    missing: dict[str, str] = {}
    for name in sorted(set(wanted), key=[s.name for s in SYSTEMS].index):  # columns in registry order
        loaded = load_system(by_name[name])
        if isinstance(loaded, str):
            missing[name] = loaded
            measure.progress(f"{name}: not available ({loaded})")
        else:
            systems.append(loaded)
    if not systems:
        print("no system available", file=sys.stderr)
        return 1

    cases = plan(args.quick)
    results: Results = {}
    with Stopwatch() as total:
        for case in cases:
            results[case.label] = run_case(case, systems, args.repeat, args.warmup)

    headers, rows, notes = build_rows(cases, results, systems)
    print()
    print("\n".join(header_lines(systems, missing, args, total.seconds)))
    print()
    print(measure.render_table(headers, rows))
    if notes:
        print("errors / gaps:")
        print("\n".join(f"  {n}" for n in notes))
    print("\n".join(wall_lines(cases, results, systems)))

    if args.json is not None:
        raw: dict[str, Any] = {
            case.label: {
                name: {"samples": cell.samples, "error": cell.error, "wall_s": cell.wall_s}
                for name, cell in results[case.label].items()
            }
            for case in cases
        }
        args.json.write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark entry point: every available system, scenario by scenario, side by side.

    python scripts/bench/run.py [--repeat 5] [--quick] [--systems floor,langgraph,flowkernel]
                                [--only S1,N1,...]

Systems are modules in this folder (see ``SYSTEMS``; a system may span several modules) exporting
scenario functions, among them

    s1(n: int) -> dict[str, float]            # chain of n nodes
    s2(branches: int = 50) -> dict[str, float]
    s3(steps: int = 200) -> dict[str, float]
    s4(iterations: int = 1000) -> dict[str, float]
    n1(n), n1_cli(n), n2(iterations), s5(runs, steps), s5_pg(...), fanout(n), foreach(n),
    deltas(), live(), startup()               # see README.md for what each measures

each returning the figures of ONE repetition (keys listed in ``METRICS``; unknown extra keys
are shown too). A module that fails to import is reported as "NAME: not available (reason)"
and skipped; a missing scenario function or a scenario that raises leaves its cells empty.
The table shows the median over ``--repeat`` runs (repetitions interleave the systems, and the
sizes of a SCHED group),
plus ratios against the floor and LangGraph. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import gc
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
    modules: tuple[str, ...]  # the first is required; the others add scenarios when they import
    short: str  # column tag used in ratio headers


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec("floor", ("floor",), "floor"),
    SystemSpec("langgraph", ("peers", "peers_natural"), "lg"),
    SystemSpec("flowkernel", ("flowkernel_side", "flowkernel_natural", "flowkernel_scale"), "fk"),
)
SCENARIO_FUNCS = ("s1", "s2", "s3", "s4", "n1", "n1_cli", "n2", "s5", "s5_pg", "fanout", "foreach", "deltas",
                  "live", "startup")
HERE = Path(__file__).resolve().parent


@dataclass
class System:
    spec: SystemSpec
    modules: list[ModuleType]
    description: str
    funcs: dict[str, ScenarioFn]


def load_system(spec: SystemSpec) -> System | str:
    """The loaded system, or the reason it is not available."""
    modules: list[ModuleType] = []
    for i, name in enumerate(spec.modules):
        if not (HERE / f"{name}.py").exists() and not (HERE / name).is_dir():
            if i == 0:
                return f"scripts/bench/{name}.py not present"
            continue
        try:
            modules.append(importlib.import_module(name))
        except Exception as exc:
            if i == 0:
                return f"{type(exc).__name__}: {exc}"
            measure.progress(f"{spec.name}: {name} not available ({type(exc).__name__}: {exc})")
    funcs: dict[str, ScenarioFn] = {}
    for module in modules:
        for fname in SCENARIO_FUNCS:
            fn = getattr(module, fname, None)
            if callable(fn) and fname not in funcs:
                funcs[fname] = fn
    if not funcs:
        return f"modules {', '.join(spec.modules)} export none of {', '.join(SCENARIO_FUNCS)}"
    describe = getattr(modules[0], "describe", None)
    description = str(describe()) if callable(describe) else spec.modules[0]
    return System(spec, modules, description, funcs)


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    ratio: bool = True


@dataclass(frozen=True)
class Case:
    scenario: str  # "S1".."S5", "N1", "N1-CLI", "N2", "SCHED", "DELTAS", "LIVE", "STARTUP"
    label: str
    func: str  # "s1".."s4", "n1", ...
    args: tuple[int, ...] = ()
    kwargs: dict[str, int] = field(default_factory=dict)
    repeat: int | None = None  # at most this many measured runs (long cases)
    group: str | None = None  # cases of one group at several sizes: growth exponents between them
    size: int = 0
    # Run the repetitions of the group's sizes in turn (5,000, 20,000, 5,000, ...) rather than all of
    # one size, then all of the next: a slower minute on a shared machine then weighs on every size
    # alike instead of bending the growth exponent.
    interleave: bool = False


# Growth exponents shown after the last case of each group: (metric, label).
GROWTH: dict[str, tuple[tuple[str, str], ...]] = {
    "s1": (("total_ms", "growth exponent of total time vs N"),
           ("db_bytes_checkpointed", "growth exponent of checkpointed db bytes vs N")),
    "n1": (("total_ms", "growth exponent of total time vs N"),
           ("db_bytes_checkpointed", "growth exponent of checkpointed db bytes vs N")),
    "n1_cli": (("total_ms", "growth exponent of total time vs N"),
               ("db_bytes_checkpointed", "growth exponent of checkpointed db bytes vs N")),
    "n2": (("total_ms", "growth exponent of total time vs iterations"),
           ("db_bytes_checkpointed", "growth exponent of checkpointed db bytes vs iterations")),
    "fanout": (("cpu_s", "growth exponent of CPU time vs branches"),),
    "foreach": (("cpu_s", "growth exponent of CPU time vs items"),),
}


def metric_specs(case: Case) -> list[MetricSpec]:
    if case.func in ("n1", "n1_cli"):
        return [
            MetricSpec("us_per_step", "us/step" + (" (whole process: spawn..exit / N)" if case.func == "n1_cli" else "")),
            MetricSpec("total_ms", "total ms"),
            MetricSpec("cpu_us_per_step", "CPU us/step", ratio=False),
            MetricSpec("db_bytes", "db+wal bytes after run"),
            MetricSpec("db_bytes_checkpointed", "db bytes after wal_checkpoint(TRUNCATE)"),
        ]
    if case.func == "n2":
        return [
            MetricSpec("us_per_iteration", "us/iteration (3 transitions)"),
            MetricSpec("total_ms", "total ms"),
            MetricSpec("cpu_us_per_iteration", "CPU us/iteration", ratio=False),
            MetricSpec("db_bytes", "db+wal bytes after run"),
            MetricSpec("db_bytes_checkpointed", "db bytes after wal_checkpoint(TRUNCATE)"),
        ]
    if case.func in ("s5", "s5_pg"):
        return [MetricSpec("transitions_per_s", "transitions/s (floor: one stream)"),
                MetricSpec("total_ms", "total ms")]
    if case.func == "fanout":
        return [MetricSpec("cpu_s", "CPU s", ratio=False), MetricSpec("cpu_us_per_node", "CPU us/node", ratio=False)]
    if case.func == "foreach":
        return [MetricSpec("cpu_s", "CPU s", ratio=False), MetricSpec("cpu_us_per_item", "CPU us/item", ratio=False)]
    if case.func in ("deltas", "live", "startup"):
        return []  # every key the function returns, as it names it
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


SCENARIOS = ("S1", "S2", "S3", "S4", "N1", "N1-CLI", "N2", "S5", "SCHED", "DELTAS", "LIVE", "STARTUP")


def plan(quick: bool) -> list[Case]:
    sizes = measure.S1_SIZES_QUICK if quick else measure.S1_SIZES
    iterations = measure.S4_ITERATIONS_QUICK if quick else measure.S4_ITERATIONS
    cases = [Case("S1", f"S1 chain N={n}", "s1", args=(n,), group="s1", size=n) for n in sizes]
    cases.append(
        Case("S2", f"S2 fan-out {measure.S2_BRANCHES} + join", "s2", kwargs={"branches": measure.S2_BRANCHES})
    )
    cases.append(
        Case("S3", f"S3 resume after {measure.S3_STEPS} steps", "s3", kwargs={"steps": measure.S3_STEPS})
    )
    cases.append(Case("S4", f"S4 3-node loop x{iterations}", "s4", kwargs={"iterations": iterations}))
    n1 = measure.N1_SIZES_QUICK if quick else measure.N1_SIZES
    cases += [Case("N1", f"N1 state.set append chain N={n}, in-process", "n1", args=(n,), group="n1", size=n,
                   repeat=3 if n > 1000 else None) for n in n1]
    cases += [Case("N1-CLI", f"N1 state.set append chain N={n}, flowkernel run (whole process)", "n1_cli", args=(n,),
                   group="n1_cli", size=n, repeat=3 if n > 1000 else None) for n in n1]
    n2 = measure.N2_SIZES_QUICK if quick else measure.N2_SIZES
    cases += [Case("N2", f"N2 3-node agent loop x{n}, growing transcript", "n2", args=(n,), group="n2", size=n,
                   repeat=3) for n in n2]
    s5 = {"runs": measure.S5_RUNS, "steps": measure.S5_STEPS}
    cases.append(Case("S5", f"S5 {measure.S5_RUNS} concurrent runs x {measure.S5_STEPS} steps, SQLite", "s5",
                      kwargs=s5))
    if os.environ.get("FLOWKERNEL_TEST_PG"):
        cases.append(Case("S5", f"S5 {measure.S5_RUNS} concurrent runs x {measure.S5_STEPS} steps, PostgreSQL",
                          "s5_pg", kwargs=s5))
    fan = measure.FANOUT_SIZES_QUICK if quick else measure.FANOUT_SIZES
    cases += [Case("SCHED", f"fan-out of {n} branches (memory)", "fanout", args=(n,), group="fanout", size=n,
                   repeat=5, interleave=True) for n in fan]
    each = measure.FOREACH_SIZES_QUICK if quick else measure.FOREACH_SIZES
    cases += [Case("SCHED", f"forEach over {n} items (memory)", "foreach", args=(n,), group="foreach", size=n,
                   repeat=5, interleave=True) for n in each]
    deltas = measure.DELTAS_QUICK if quick else measure.DELTAS
    cases.append(Case("DELTAS", f"{deltas:,} agent text deltas, one per {measure.DELTA_PACE_S * 1000:g} ms",
                      "deltas", kwargs={"n": deltas}, repeat=3))
    cases.append(Case("LIVE", "S1 N=1000 with and without the live view", "live", repeat=5))
    cases.append(Case("STARTUP", f"start-up (medians of {measure.STARTUP_RUNS} spawns)", "startup", repeat=1))
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


def run_cases(cases: Sequence[Case], systems: Sequence[System], repeat: int, warmup: int) -> Results:
    """Run ``cases`` (one, or the sizes of an interleaved group) repetition by repetition: each
    repetition runs every case once, every system once per case."""
    results: Results = {c.label: {s.spec.name: CellResult() for s in systems} for c in cases}
    active = [s for s in systems if cases[0].func in s.funcs]  # a system without the scenario shows blanks
    bound = min((c.repeat for c in cases if c.repeat is not None), default=None)
    if bound is not None:
        repeat = min(repeat, bound)
        warmup = min(warmup, 1 if bound > 1 else 0)
    total = warmup + repeat
    for rep in range(total):
        # rotate the order each repetition so no system always runs first
        order = active[rep % len(active) :] + active[: rep % len(active)] if active else []
        for case in cases:
            for system in order:
                cell = results[case.label][system.spec.name]
                if cell.error is not None:
                    continue
                tag = f"warm-up {rep + 1}/{warmup}" if rep < warmup else f"rep {rep - warmup + 1}/{repeat}"
                measure.progress(f"[{case.label}] {system.spec.name} {tag} ...")
                # What earlier scenarios and systems left behind is collected now, not inside this one's timing.
                gc.collect()
                try:
                    with Stopwatch() as sw:
                        metrics = call_scenario(system, case)
                except measure.Skipped as exc:
                    cell.error = f"not run: {exc}"
                    measure.progress(f"[{case.label}] {system.spec.name}: not run ({exc})")
                    continue
                except Exception as exc:
                    cell.error = f"{type(exc).__name__}: {exc}"
                    measure.progress(traceback.format_exc())
                    continue
                cell.wall_s += sw.seconds
                if rep >= warmup:
                    cell.samples.append(metrics)
                measure.progress(f"[{case.label}] {system.spec.name} {tag} done in {sw.seconds:.2f} s")
    return results


def batches(cases: Sequence[Case]) -> list[list[Case]]:
    """``cases`` in the runs ``run_cases`` takes: an interleaved group's sizes together, others alone."""
    out: list[list[Case]] = []
    for case in cases:
        if case.interleave and out and out[-1][0].interleave and out[-1][0].group == case.group:
            out[-1].append(case)
        else:
            out.append([case])
    return out


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
        members = [c for c in cases if case.group is not None and c.group == case.group]
        if len(members) >= 2 and case is members[-1]:
            rows.append([])
            sizes = [float(c.size) for c in members]
            for i, (key, label) in enumerate(GROWTH.get(case.func, ())):
                exps: dict[str, float | None] = {}
                for n in names:
                    ys = [results[c.label][n].median(key) for c in members]
                    clean = [y for y in ys if y is not None and y > 0]
                    exps[n] = measure.growth_exponent(sizes, clean) if len(clean) == len(ys) else None
                add_row(f"{case.scenario} (log-log slope)" if i == 0 else "", label, exps, False, True)
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
        parts = [f"{s.spec.name} {results[case.label][s.spec.name].wall_s:.1f}" for s in systems
                 if case.func in s.funcs]
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
    parser.add_argument("--only", default=None, metavar="S1,N1,...",
                        help="comma-separated scenarios to run, of: " + ", ".join(SCENARIOS))
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
    if args.only:
        wanted_scenarios = {w.strip().upper() for w in args.only.split(",") if w.strip()}
        unknown_scenarios = wanted_scenarios - set(SCENARIOS)
        if unknown_scenarios:
            print(f"unknown scenario(s): {', '.join(sorted(unknown_scenarios))}; known: {', '.join(SCENARIOS)}",
                  file=sys.stderr)
            return 2
        cases = [c for c in cases if c.scenario in wanted_scenarios]
    results: Results = {}
    with Stopwatch() as total:
        for batch in batches(cases):
            results.update(run_cases(batch, systems, args.repeat, args.warmup))

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

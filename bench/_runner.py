"""Runs benchmarks, takes medians, computes ratios and targets, renders markdown and rich."""

from __future__ import annotations

import os
import statistics
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from bench._core import (
    Benchmark,
    Case,
    Config,
    Measurement,
    Sizes,
    Skipped,
    Target,
    WrongResult,
)

__all__ = ["BenchResult", "CaseResult", "render_markdown", "render_rich", "run_benchmark"]

OK, SKIPPED, WRONG, ERROR = "ok", "skipped", "WRONG RESULT", "error"


@dataclass
class CaseResult:
    case: Case
    runs: list[Measurement] = field(default_factory=list)
    status: str = OK
    message: str = ""

    def median(self, metric: str) -> float | None:
        if self.status != OK or not self.runs:
            return None
        if metric == "value":
            values = [m.value for m in self.runs]
        elif metric == "bytes":
            values = [m.bytes_per_step for m in self.runs if m.bytes_per_step is not None]
        else:
            values = [m.extra[metric] for m in self.runs if metric in m.extra]
        return statistics.median(values) if values else None

    def spread(self) -> tuple[float, float] | None:
        if self.status != OK or len(self.runs) < 2:
            return None
        values = [m.value for m in self.runs]
        return min(values), max(values)


@dataclass
class BenchResult:
    benchmark: Benchmark
    cases: list[CaseResult]
    repeat: int
    note: str | None
    seconds: float

    def get(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.case.name == name), None)

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if c.status in (WRONG, ERROR)]

    @property
    def skipped(self) -> list[CaseResult]:
        return [c for c in self.cases if c.status == SKIPPED]


def _attempt(
    result: CaseResult, cfg: Config, console: Console, label: str, bench: Benchmark, *, show: bool
) -> None:
    """Run the case once; record its measurement (when ``show``) or its failure status."""
    os.sync()  # flush earlier cases' writes so they do not land on this case's clock
    try:
        m = result.case.fn(cfg)
    except Skipped as s:
        result.status, result.message = SKIPPED, str(s)
        console.print(f"{label}: [yellow]skipped: {s}[/yellow]")
        return
    except WrongResult as w:
        result.status, result.message = WRONG, str(w)
        console.print(f"{label}: [bold red]WRONG RESULT: {w}[/bold red]")
        return
    except Exception as error:
        result.status = ERROR
        result.message = f"{type(error).__name__}: {error}"
        console.print(f"{label}: [bold red]error[/bold red]\n{traceback.format_exc()}")
        return
    if not show:
        return
    result.runs.append(m)
    extra = f", {m.bytes_per_step:,.0f} B/superstep" if m.bytes_per_step is not None else ""
    console.print(f"{label}: {_fmt(m.value)} {bench.metric}{extra}")


def run_benchmark(
    bench: Benchmark, cfg: Config, console: Console, case_filter: str | None = None
) -> BenchResult:
    start = time.perf_counter()
    cases = [c for c in bench.cases if not case_filter or case_filter.lower() in c.name.lower()]
    results = [CaseResult(c) for c in cases]
    repeat = min(cfg.repeat, bench.max_repeat or cfg.repeat)
    console.rule(f"[bold]{bench.title}")
    note = None
    if bench.prepare is not None:
        try:
            note = bench.prepare(cfg)
        except Exception as error:
            message = f"prepare failed: {type(error).__name__}: {error}"
            console.print(f"[red]{message}[/red]\n{traceback.format_exc()}")
            for r in results:
                r.status, r.message = ERROR, message
        if note:
            console.print(f"[dim]{note}[/dim]")
    if bench.warmup and not cfg.smoke:
        # One untimed run of every case at smoke sizes: first-call costs (lazy imports, pydantic
        # schema builds, connection set-up) stay off the clock. Its result is still checked.
        small = replace(cfg, sizes=Sizes.smoke())
        for result in results:
            _attempt(result, small, console, f"  {result.case.name} [warm-up]", bench, show=False)
    for attempt in range(repeat):
        for result in results:
            if result.status == OK:
                label = f"  {result.case.name} [{attempt + 1}/{repeat}]"
                _attempt(result, cfg, console, label, bench, show=True)
    return BenchResult(bench, results, repeat, note, time.perf_counter() - start)


# -- rendering ----------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _table(res: BenchResult) -> tuple[list[str], list[list[str]]]:
    b = res.benchmark
    base = res.get(b.baseline)
    base_value = base.median("value") if base else None
    headers = ["case", f"{b.metric} (median)", "min-max", f"x {b.baseline}"]
    if b.show_bytes:
        headers.append(b.bytes_header)
    headers += [h for _, h in b.extra_columns]
    headers.append("note")
    rows = []
    for c in res.cases:
        name = f"**{c.case.name}**" if c.case.steplog else c.case.name
        spread = c.spread()
        ratio = _ratio(c.median("value"), base_value)
        row = [
            name,
            _fmt(c.median("value")),
            f"{_fmt(spread[0])}-{_fmt(spread[1])}" if spread else "—",
            _fmt_ratio(ratio),
        ]
        if b.show_bytes:
            row.append(_fmt(c.median("bytes")))
        row += [_fmt(c.median(key)) for key, _ in b.extra_columns]
        notes = [m.note for m in c.runs[:1] if m.note]
        if c.status != OK:
            notes.insert(0, f"{c.status}: {c.message}")
        row.append("; ".join(notes).replace("|", "/").replace("\n", " ")[:300])
        rows.append(row)
    return headers, rows


def _target(res: BenchResult, t: Target) -> list[str]:
    case = res.get(t.case)
    actual = case.median(t.metric) if case else None
    if t.baseline is not None:
        base = res.get(t.baseline)
        actual = _ratio(actual, base.median(t.metric) if base else None)
        shown = _fmt_ratio(actual)
        want = f"{t.op} {_fmt_ratio(t.value)}"
    else:
        shown = _fmt(actual)
        want = f"{t.op} {_fmt(t.value)}"
    if actual is None:
        verdict = "n/a"
        if case is not None and case.status != OK:
            verdict = case.status
    else:
        ok = actual >= t.value if t.op == ">=" else actual <= t.value
        verdict = "met" if ok else "NOT MET"
    return [t.text, shown, want, verdict]


def render_markdown(env: list[tuple[str, str]], results: list[BenchResult], smoke: bool) -> str:
    out = ["# steplog benchmark results", ""]
    out.append(
        "Generated by `python -m bench`. Every figure is measured in the same run as its "
        "baseline; each number is the median of the run's repeats. Bold rows are steplog."
    )
    if smoke:
        out += ["", "**Smoke run (tiny sizes): these numbers mean nothing.**"]
    out += ["", "| | |", "|---|---|"]
    out += [f"| {k} | `{v}` |" for k, v in env]
    for res in results:
        b = res.benchmark
        out += ["", f"## {b.title}", "", b.description, ""]
        if res.note:
            out += [f"_{res.note}_", ""]
        out.append(f"_{res.repeat} run(s) per case, {res.seconds:.0f} s in all._")
        out.append("")
        headers, rows = _table(res)
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---" for _ in headers) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows]
        if b.targets:
            out += ["", "| target | measured | wanted | verdict |", "|---|---|---|---|"]
            out += ["| " + " | ".join(_target(res, t)) + " |" for t in b.targets]
    out.append("")
    return "\n".join(out)


def render_rich(console: Console, env: list[tuple[str, str]], results: list[BenchResult]) -> None:
    info = Table(title="environment", show_header=False)
    for k, v in env:
        info.add_row(k, v)
    console.print(info)
    for res in results:
        headers, rows = _table(res)
        table = Table(title=res.benchmark.title, caption=res.note or None)
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i in (0, len(headers) - 1) else "right")
        for r in rows:
            table.add_row(
                *[cell.replace("**", "") for cell in r], style="bold" if "**" in r[0] else None
            )
        console.print(table)
        if res.benchmark.targets:
            targets = Table(title="targets")
            for h in ("target", "measured", "wanted", "verdict"):
                targets.add_column(h)
            for t in res.benchmark.targets:
                row = _target(res, t)
                style = {"met": "green", "NOT MET": "red"}.get(row[-1], "yellow")
                targets.add_row(*row, style=style)
            console.print(targets)


def summary_counts(results: list[BenchResult]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for res in results:
        for c in res.cases:
            counts[c.status] = counts.get(c.status, 0) + 1
    return counts

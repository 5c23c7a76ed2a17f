"""Benchmark: page loads of ``steplog ui`` at 100,000 supersteps, beside the CLI's times for
the same queries.

On the time-travel benchmark's log (one instance of 100,000 supersteps, with snapshots every 50
supersteps, the key index and the history view built: ``timetravel.prepare``), each case times
one request, many times, and reports p50 (the headline) and p95, plus the first load (a fresh
server, which starts the run history from the history view, or a fresh CLI call, which folds
it). The UI cases go through Starlette's
TestClient (the whole application: routing, the projections, the templates; no socket); the
CLI cases call ``projections.cli.main`` in this process with its output captured (no Python
start-up), for ``runs INSTANCE --json``, ``show RUN --json``, ``state INSTANCE step:ID --json``
and ``blame INSTANCE KEY --json``. Every answer is checked: status 200 (0), and the state's and
the blame's rows against the generator's definition of the log.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench import timetravel
from bench._core import Benchmark, Case, Config, Measurement, Skipped, Target, expect
from kernel import open_store

__all__ = ["BENCHMARK"]

UI_RUNS = "ui: run list (GET /)"
UI_STATE = "ui: state after a superstep (GET /i/ID/state?at=step:S)"
CLI_RUNS = "cli: runs INSTANCE --json"
KEY = "k7"


def _url(cfg: Config) -> str:
    return f"sqlite:///{cfg.shared['tt_snap_log']}"


def _percentiles(times: list[float], first: float) -> Measurement:
    times = sorted(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return Measurement(statistics.median(times), extra={"p95_ms": p95, "first_ms": first})


def _samples(cfg: Config, *, cli: bool = False) -> int:
    """Requests per UI case; the CLI's calls each fold the whole history, so fewer of them."""
    if cfg.smoke:
        return 5
    return 6 if cli else 20


def _supersteps(cfg: Config, count: int) -> list[str]:
    """Random superstep ids (the k-th draw of every run is the same)."""
    store = open_store(_url(cfg), create=False)
    try:
        ids = cfg.shared.get("ui_steps")
        if ids is None:
            ids = [
                e.superstep_id  # type: ignore[attr-defined]
                for e in store.read(timetravel._instance(cfg), types=["superstep_started"])
            ]
            cfg.shared["ui_steps"] = ids
    finally:
        store.close()
    rng = random.Random(7)
    return [ids[rng.randrange(len(ids))] for _ in range(count)]


def _ui(cfg: Config, paths: Callable[[int], str], check: Callable[[str], None]) -> Measurement:
    try:
        from starlette.testclient import TestClient

        from projections.ui import create_app
    except ImportError as error:
        raise Skipped(f"the ui extra is not installed (pip install -e '.[ui]'): {error}") from None
    store = open_store(_url(cfg), create=False)
    try:
        with TestClient(create_app(store), base_url="http://127.0.0.1") as client:
            times = []
            for n in range(_samples(cfg) + 1):
                start = time.perf_counter()
                response = client.get(paths(n))
                times.append((time.perf_counter() - start) * 1000)
                expect(response.status_code, 200, f"GET {paths(n)}")
                check(response.text)
    finally:
        store.close()
    return _percentiles(times[1:], times[0])


def _cli(
    cfg: Config, argv: Callable[[int], list[str]], check: Callable[[Any], None]
) -> Measurement:
    from projections.cli import main

    times = []
    for n in range(_samples(cfg, cli=True) + 1):
        out = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = main(["--store", _url(cfg), *argv(n)])
        times.append((time.perf_counter() - start) * 1000)
        expect(status, 0, f"steplog {' '.join(argv(n))}")
        check(orjson.loads(out.getvalue()))
    return _percentiles(times[1:], times[0])


def _runs_expected(cfg: Config) -> int:
    return len(timetravel._spec(cfg).runs())


def ui_runs(cfg: Config) -> Measurement:
    """``GET /``: every run of the store (paged, 50 a page)."""
    want = min(50, _runs_expected(cfg))
    return _ui(
        cfg,
        lambda n: "/",
        lambda page: expect(len(re.findall(r'<tr class="run"', page)), want, "runs shown"),
    )


def cli_runs(cfg: Config) -> Measurement:
    """``steplog runs INSTANCE --json``: every run."""
    want = _runs_expected(cfg)
    return _cli(
        cfg,
        lambda n: ["runs", timetravel._instance(cfg), "--json"],
        lambda doc: expect(len(doc["runs"]), want, "runs listed"),
    )


def ui_timeline(cfg: Config) -> Measurement:
    """``GET /i/ID?run=RUN``: a run's timeline, first page (50 supersteps)."""
    instance = timetravel._instance(cfg)
    run = _a_run(cfg)
    want = min(50, timetravel._spec(cfg).run_length)
    return _ui(
        cfg,
        lambda n: f"/i/{instance}?run={run}",
        lambda page: expect(page.count('<li class="step '), want, "supersteps shown"),
    )


def ui_graph(cfg: Config) -> Measurement:
    """``GET /i/ID/graph``: the instance's graph, which the pages fetch once shown: the one
    answer that scans the log (on the first load; kept by the server afterwards)."""
    instance = timetravel._instance(cfg)
    return _ui(
        cfg,
        lambda n: f"/i/{instance}/graph",
        lambda page: expect(page.count("<svg"), 1, "graphs drawn"),
    )


def cli_show(cfg: Config) -> Measurement:
    """``steplog show RUN --json``: the same run and every one of its supersteps."""
    run = _a_run(cfg)
    want = timetravel._spec(cfg).run_length
    return _cli(
        cfg,
        lambda n: ["show", "--json", "--", run],
        lambda doc: expect(len(doc["supersteps"]), want, "supersteps listed"),
    )


def _a_run(cfg: Config) -> str:
    found = cfg.shared.get("ui_run")
    if found is None:
        store = open_store(_url(cfg), create=False)
        try:
            starts = store.read(timetravel._instance(cfg), types=["run_started"])
            found = starts[len(starts) // 2].run_id  # type: ignore[attr-defined]
        finally:
            store.close()
        cfg.shared["ui_run"] = found
    return str(found)


def _state_check(cfg: Config) -> Callable[[str, str], None]:
    spec = timetravel._spec(cfg)
    ids: list[str] = cfg.shared["ui_steps"]
    index = {sid: g for g, sid in enumerate(ids, start=1)}

    def check(step: str, keys: str) -> None:
        expect(int(keys), len(spec.state_at(index[step])), f"keys at superstep {step}")

    return check


def ui_state(cfg: Config) -> Measurement:
    """``GET /i/ID/state?at=step:ID``: state after a random superstep (from the snapshots)."""
    instance = timetravel._instance(cfg)
    steps = _supersteps(cfg, _samples(cfg) + 1)
    check = _state_check(cfg)
    seen: list[int] = []

    def path(n: int) -> str:
        seen.append(n)
        return f"/i/{instance}/state?at=step:{steps[n]}"

    return _ui(cfg, path, lambda page: check(steps[seen[-1]], str(page.count("<tr data-key="))))


def cli_state(cfg: Config) -> Measurement:
    """``steplog state INSTANCE step:ID --json``: the same points."""
    instance = timetravel._instance(cfg)
    steps = _supersteps(cfg, _samples(cfg) + 1)
    check = _state_check(cfg)
    seen: list[int] = []

    def argv(n: int) -> list[str]:
        seen.append(n)
        return ["state", instance, f"step:{steps[n]}", "--json"]

    return _cli(cfg, argv, lambda doc: check(steps[seen[-1]], str(len(doc))))


def _writes(cfg: Config) -> int:
    spec = timetravel._spec(cfg)
    return sum(1 for g in range(1, spec.supersteps + 1) if spec.second_key(g) == KEY)


def ui_blame(cfg: Config) -> Measurement:
    """``GET /i/ID/blame/KEY``: every write of one key (through the key index)."""
    instance = timetravel._instance(cfg)
    want = _writes(cfg)
    return _ui(
        cfg,
        lambda n: f"/i/{instance}/blame/{KEY}",
        lambda page: expect(page.count('<tr class="write '), want, "writes shown"),
    )


def cli_blame(cfg: Config) -> Measurement:
    """``steplog blame INSTANCE KEY --json``."""
    instance = timetravel._instance(cfg)
    want = _writes(cfg)
    return _cli(
        cfg,
        lambda n: ["blame", instance, KEY, "--json"],
        lambda doc: expect(len(doc["writes"]), want, "writes listed"),
    )


BENCHMARK = Benchmark(
    name="ui",
    title="10. steplog ui page loads at 100,000 supersteps, beside the CLI",
    description=(
        "One request per sample on the time-travel benchmark's log (snapshots, key index and "
        "history view built); p50 is the headline, p95 and the first load (a fresh server or "
        "CLI call, which reads or folds the instance's run history) beside it. UI: Starlette's "
        "TestClient over the whole application; CLI: projections.cli.main in this process, "
        "output captured."
    ),
    metric="p50 ms",
    higher_is_better=False,
    baseline=CLI_RUNS,
    extra_columns=[("p95_ms", "p95 ms"), ("first_ms", "first ms")],
    max_repeat=1,
    prepare=timetravel.prepare,
    cases=[
        Case(UI_RUNS, ui_runs, steplog=True),
        Case(CLI_RUNS, cli_runs, steplog=True),
        Case("ui: a run's timeline (GET /i/ID?run=RUN)", ui_timeline, steplog=True),
        Case("cli: show RUN --json", cli_show, steplog=True),
        Case("ui: the graph (GET /i/ID/graph)", ui_graph, steplog=True),
        Case(UI_STATE, ui_state, steplog=True),
        Case("cli: state INSTANCE step:S --json", cli_state, steplog=True),
        Case("ui: blame of one key (GET /i/ID/blame/KEY)", ui_blame, steplog=True),
        Case("cli: blame INSTANCE KEY --json", cli_blame, steplog=True),
    ],
    targets=[
        Target("ui state after a superstep: p50 <= 200 ms", UI_STATE, "<=", 200.0),
    ],
)

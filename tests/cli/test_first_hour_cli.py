"""What a new user met in the first hour with the ``steplog`` command (issue 21).

- A point naming an open superstep is refused in the command line's own words (``inside:ID``),
  never the Python class's (``InsideSuperstep``).
- The error for a key with no value says where once ("in 'x' (committed state at position N)").
- The ``checkpoints`` footer is a whole sentence.
- A point is never moved silently: ``pos:N`` past the last position (or negative), a superstep
  index a run never reached, are refused (status 2), by ``state``, ``diff`` and ``fork``.
- A request id may be shortened to a unique prefix (``respond RUN REQUEST JSON``), with the
  rules of every other id: an exact id wins, an ambiguous prefix is refused with the candidates
  (an unknown id with the requests pending).
"""

from __future__ import annotations

import orjson
import pytest

from kernel import open_store
from kernel.testing import LogBuilder, ticking_clock
from projections.cli import EXIT_BAD_INPUT, main

INSTANCE = "orders-1"
RUN1, RUN2 = "run-one", "run-two"
DONE, OPEN = "step-done", "step-open"


def stored(url: str, log: LogBuilder) -> LogBuilder:
    with open_store(url) as store:
        log.append_to(store)
    return log


@pytest.fixture
def open_superstep(sqlite_url: str) -> tuple[str, int]:
    """A committed superstep, then a run whose superstep is still open (its process died)."""
    log = LogBuilder(INSTANCE, clock=ticking_clock())
    log.start_run(1, run_id=RUN1)
    log.start_superstep(superstep_id=DONE)
    log.invoke("writer")
    log.write("a", 1)
    log.commit()
    log.complete_run()
    log.start_run(2, run_id=RUN2)
    log.start_superstep(superstep_id=OPEN)
    log.invoke("writer")
    log.write("a", 2)
    return sqlite_url, stored(sqlite_url, log).version


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line of ``steplog ARGS``, which must exit 2 and print nothing on stdout."""
    assert main(list(args)) == EXIT_BAD_INPUT, args
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return " ".join(captured.err.split())


def test_an_open_superstep_is_refused_in_the_command_lines_words(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = open_superstep
    for point in (f"step:{OPEN}", f"run:{RUN2}:1", "step:step-o"):
        err = refused(capsys, "--store", url, "state", INSTANCE, point)
        assert "InsideSuperstep" not in err
        assert f"inside:{OPEN} shows the state inside it" in err
    assert main(["--store", url, "state", INSTANCE, f"inside:{OPEN}"]) == 0


def test_a_superstep_index_a_run_never_reached_is_refused(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = open_superstep
    for index in ("99", "0", "-1"):
        err = refused(capsys, "--store", url, "state", INSTANCE, f"run:{RUN1}:{index}")
        assert f"run {RUN1} has no superstep {index} (its last is 1)" in err
        assert "InsideSuperstep" not in err
    assert main(["--store", url, "state", INSTANCE, f"run:{RUN1}:1"]) == 0


def test_a_position_past_the_log_is_refused_never_clamped(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, version = open_superstep
    for point in (f"pos:{version + 1}", "pos:9999", "pos:-1"):
        err = refused(capsys, "--store", url, "state", INSTANCE, point)
        assert f"bad point {point!r}: the instance's positions are 1 to {version}" in err
        refused(capsys, "--store", url, "diff", INSTANCE, "pos:1", point)
        refused(capsys, "--store", url, "fork", INSTANCE, point, "--to", "copy")
    with open_store(url) as store:
        assert store.version("copy") == 0  # nothing was forked
    assert main(["--store", url, "state", INSTANCE, f"pos:{version}"]) == 0
    assert f"committed state at position {version}" in " ".join(capsys.readouterr().out.split())
    assert main(["--store", url, "diff", INSTANCE, "pos:0", f"pos:{version}"]) == 0


def test_a_missing_key_is_named_with_where_it_was_looked_for_once(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = open_superstep
    err = refused(capsys, "--store", url, "state", INSTANCE, "pos:3", "--key", "b")
    assert "at committed state" not in err
    assert f"key 'b' has no value in '{INSTANCE}' (committed state at position 3)" in err


def test_the_checkpoints_footer_is_a_whole_sentence(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = open_superstep
    assert main(["--store", url, "checkpoints", INSTANCE]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.endswith(
        "the latest is where the run goes on (wf.resume()); 'steplog fork' can branch from any "
        "of them"
    )


@pytest.fixture
def waiting(sqlite_url: str) -> str:
    """A run waiting for responses to three requests, two of them sharing a prefix."""
    log = LogBuilder(INSTANCE, clock=ticking_clock())
    log.start_run(1, run_id=RUN1)
    log.start_superstep(superstep_id=DONE)
    log.invoke("reviewer")
    for request in ("approve-7f3a", "review-91b2", "review-91c4"):
        log.request({"draft": 1}, request_id=request, response_type="str")
    log.commit()
    log.await_input(["approve-7f3a", "review-91b2", "review-91c4"])
    stored(sqlite_url, log)
    return sqlite_url


def test_a_request_id_may_be_a_unique_prefix(
    waiting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", waiting, "--json", "respond", "run-", "appr", '"yes"']) == 0
    recorded = orjson.loads(capsys.readouterr().out)
    assert recorded["request_id"] == "approve-7f3a"
    answer = recorded["run_id"]  # the run that goes on, waiting for the two others
    assert main(["--store", waiting, "respond", answer[:10], "review-91c", '"no"']) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"recorded the response to request review-91c4 of {INSTANCE}" in out


def test_a_request_prefix_is_refused_as_every_id_is(
    waiting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, "--store", waiting, "respond", RUN1, "review-91", '"x"')
    assert "request 'review-91' is ambiguous" in err
    assert "review-91b2, review-91c4" in err
    err = refused(capsys, "--store", waiting, "respond", RUN1, "reveiw-91b2", '"x"')
    assert (
        "no pending request 'reveiw-91b2' (pending: approve-7f3a, review-91b2, review-91c4)" in err
    )
    with open_store(waiting) as store:
        assert store.version(INSTANCE) == 8  # nothing was recorded


@pytest.mark.parametrize(
    "point",
    [
        "pos:abc",
        "pos:",
        "pos:1.5",
        f"run:{RUN1}:x",
        f"run:{RUN1}",
        "time:yesterday",
        "time:2026-11-30T14:55:00",
        "position:3",
    ],
)
def test_a_malformed_point_says_what_a_point_is_never_pythons_words(
    open_superstep: tuple[str, int], capsys: pytest.CaptureFixture[str], point: str
) -> None:
    url, _ = open_superstep
    for command in (("state", INSTANCE, point), ("diff", INSTANCE, "pos:0", point)):
        err = refused(capsys, "--store", url, *command)
        assert f"bad point {point!r}" in err
        for form in ("pos:N", "step:SUPERSTEP", "run:RUN:INDEX", "inside:SUPERSTEP", "time:"):
            assert form in err, (form, err)
        for python in ("invalid literal", "int()", "base 10", "isoformat string"):
            assert python not in err, err

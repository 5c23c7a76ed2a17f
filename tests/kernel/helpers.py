"""Small helpers for reading a workflow's log in assertions."""

from __future__ import annotations

from typing import Any

from kernel import EventBase, Workflow


def of_type(events: list[EventBase], kind: str) -> list[Any]:
    """The events of one ``type``, in log order."""
    return [e for e in events if e.type == kind]  # type: ignore[attr-defined]


def kinds(events: list[EventBase]) -> list[str]:
    return [e.type for e in events]  # type: ignore[attr-defined]


def markers(wf: Workflow) -> dict[str, str]:
    """superstep id -> "committed" or "aborted:<reason>", for every marker in the log."""
    found: dict[str, str] = {}
    for event in wf.events():
        if event.type == "superstep_committed":  # type: ignore[attr-defined]
            found[event.superstep_id] = "committed"  # type: ignore[attr-defined]
        elif event.type == "superstep_aborted":  # type: ignore[attr-defined]
            found[event.superstep_id] = f"aborted:{event.reason}"  # type: ignore[attr-defined]
    return found


def staged(wf: Workflow, key: str) -> list[Any]:
    """Every StateStaged event for ``key``."""
    return [e for e in of_type(wf.events(), "state_staged") if e.key == key]


def fate_of(wf: Workflow, key: str) -> list[str]:
    """For each staged write of ``key``, its superstep's marker (or "none")."""
    found = markers(wf)
    return [found.get(e.superstep_id, "none") for e in staged(wf, key)]

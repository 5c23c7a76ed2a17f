"""A run's recorded steps as both front ends show them: read from the log (the records a served
call reused found where they are), redacted by the instance's rule, and said as text.

The verdict beside each step is its superstep's in the run history (``RecordedStep``); what is
redacted is ``SensitiveKeys``' rule (a step's arguments and result, matched by the step's
name). A step's arguments are in the log only when it records them
(``@step(record_arguments=True)``); otherwise their digest is what is shown of them.

Values are shown as text to read, escaped (``visible``): a conversation (Agent Framework's
``Message``, a list of them, or a response holding ``messages``: a model call's prompt and
answer) as one line per message, its role and its text (a tool call and a tool result said in
words), whether the codec stored the messages as tagged objects (``{"$t": "object", ...}``) or
as their plain fields; anything else as a string or indented JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from kernel import EventStore, StepRecorded
from projections import SensitiveKeys, SuperstepRecord, is_redacted
from projections._folds._steps import RecordedStep, recorded_steps
from projections._frontend._render import show_json
from projections._frontend._safe import visible

__all__ = [
    "RESULT_CHARS",
    "arguments_text",
    "conversation_text",
    "duration_text",
    "result_parts",
    "result_text",
    "reused_text",
    "step_line",
    "steps_of",
    "usage_parts",
    "verdict_text",
]

RESULT_CHARS = 4000
"""The most characters of a step's result a page shows: a longer one is cut, saying its length
and where it is whole (``steplog steps RUN --json``)."""


def steps_of(
    store: EventStore,
    instance_id: str,
    records: Sequence[StepRecorded],
    supersteps: Mapping[str, SuperstepRecord],
    rule: SensitiveKeys,
) -> list[RecordedStep]:
    """``records`` (step records of ``instance_id``, in stream order, as read) with their
    supersteps' verdicts (``supersteps``: the run history's records by id), each served call's
    origin (the record at its ``reused`` position: among ``records``, else read from the log in
    one ``read_ranges``, each event checked against its hash), redacted by ``rule``. Raises what
    the store's reads raise: a tampered record is refused, never shown."""
    known = {record.position for record in records}
    wanted = sorted({r.reused for r in records if r.reused is not None} - known)
    origins: dict[int, StepRecorded] = {}
    if wanted:
        for event in store.read_ranges(
            instance_id, [(position - 1, position) for position in wanted], types=("step_recorded",)
        ):
            if isinstance(event, StepRecorded):
                origins[event.position] = event
    return [rule.step(step) for step in recorded_steps(records, supersteps, origins)]


def verdict_text(step: RecordedStep) -> str:
    """The verdict of the step's superstep: ``committed``, ``aborted (reason)`` or ``open``."""
    return step.verdict + (f" ({step.reason})" if step.reason else "")


def duration_text(seconds: float) -> str:
    """A duration as a person reads it: ``6 µs``, ``12.5 ms``, ``3.21 s``."""
    if seconds < 0.001:
        return f"{seconds * 1_000_000:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def usage_parts(usage: Mapping[str, int] | None) -> list[str]:
    """Token counts as ``["input_tokens=12", "output_tokens=5"]`` (none when none were
    reported)."""
    return [f"{name}={count}" for name, count in (usage or {}).items()]


def reused_text(step: RecordedStep, *, width: int | None = None) -> str:
    """Where a served call's result comes from: ``reused #4 of run RUN`` (the position and the
    run of the record it reused, its id cut to ``width``), or that the log holds no step record
    there; empty for a call that ran."""
    position = step.record.reused
    if position is None:
        return ""
    if step.origin_run is None:
        return f"reused #{position} (no step record there)"
    return f"reused #{position} of run {step.origin_run[:width]}"


def step_line(step: RecordedStep, *, width: int = 8) -> str:
    """A step in one line (``show``'s superstep table): its name, then where it was served from,
    or its error's type, or how long it ran."""
    error = step.record.error
    if step.served:
        what = reused_text(step, width=width)
    elif error is not None:
        what = f"error {error.type.rpartition('.')[2]}"  # its module: in ``steps``
    else:
        what = duration_text(step.record.duration)
    return f"{step.record.name}: {what}"


def arguments_text(digest: str | None) -> str:
    """What the log says of a call's arguments when its step does not record them: only their
    digest (SHA-256 of their canonical form), or that they have none (no arguments, or none
    with a canonical form)."""
    if digest is None:
        return "no digest (no arguments, or none with a canonical form)"
    return f"sha256 {digest}"


def _fields(value: Any) -> Any:
    """A tagged object's stored fields (``{"$t": "object", "cls": ..., "v": fields}``, as the
    codec stores a class it may not have registered), or ``value`` as it is."""
    if type(value) is dict and value.get("$t") in _TAGGED_OBJECTS and "v" in value:
        return value["v"]
    return value


_TAGGED_OBJECTS = frozenset({"object", "model", "dataclass"})


def _messages(value: Any) -> list[dict[str, Any]] | None:
    """``value`` as a list of messages' fields (a message, a list of messages, or a response
    holding ``messages``: its ``type`` says ``..._response``, as AF's ``ChatResponse`` and
    ``AgentResponse`` do), or None when it is not a conversation."""
    value = _fields(value)
    if type(value) is dict and str(value.get("type", "")).endswith("_response"):
        value = value.get("messages")
    items = [_fields(item) for item in value] if type(value) is list else [value]
    if not items or not all(
        type(item) is dict and type(item.get("role")) is str and type(item.get("contents")) is list
        for item in items
    ):
        return None
    return items


def _content_text(content: Any) -> str:
    content = _fields(content)
    if type(content) is not dict:
        return orjson.dumps(content).decode()
    kind = content.get("type")
    if kind == "text" and type(content.get("text")) is str:
        return str(content["text"])
    if kind == "function_call":
        arguments = content.get("arguments")
        shown = arguments if type(arguments) is str else orjson.dumps(arguments).decode()
        return f"calls {content.get('name')}({shown}) [{content.get('call_id')}]"
    if kind == "function_result":
        result = content.get("result")
        shown = result if type(result) is str else orjson.dumps(result).decode()
        return f"result of [{content.get('call_id')}]: {shown}"
    rest = {k: v for k, v in content.items() if k not in ("type", "additional_properties")}
    return f"({kind}) {orjson.dumps(rest).decode()}"


def conversation_text(value: Any) -> str | None:
    """``value`` as a conversation to read, one message a line (``user: Book a seat``; a tool
    call as ``assistant: calls hold_seat({"flight":"TP123"}) [call-2]``; a text's own line
    breaks kept, the lines after the first indented, so that no text passes for a message), or
    None when it holds no messages. Not escaped: ``result_text`` escapes what it returns."""
    messages = _messages(value)
    if messages is None:
        return None
    lines = []
    for message in messages:
        parts = [_content_text(content) for content in message["contents"]]
        text = " ".join(parts).replace("\n", "\n  ")  # its own lines indented: never a message
        lines.append(f"{message['role']}: {text}")
    return "\n".join(lines)


def result_text(value: Any, *, limit: int = RESULT_CHARS) -> str:
    """A step's result (or an argument) as text to read: a conversation as one line per message
    (``conversation_text``), a string as it is (a model's answer keeps its lines), anything else
    as indented JSON; control and bidi characters escaped visibly (``visible``: newlines and tabs
    kept), cut after ``limit`` characters saying how long it is in all."""
    conversation = conversation_text(value)
    if conversation is not None:
        text = visible(conversation, keep="\n\t")
    elif isinstance(value, str):
        text = visible(value, keep="\n\t")
    elif is_redacted(value):
        text = show_json(value)  # as every redacted value is shown: {"$t":"redacted"}
    else:
        text = visible(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(), keep="\n")
    if len(text) <= limit:
        return text
    return (
        f"{text[:limit]}\n... ({len(text):,} characters in all; steplog steps RUN --json prints "
        "it whole)"
    )


def result_parts(value: Any, *, limit: int = RESULT_CHARS) -> list[tuple[str | None, str]]:
    """A step's result or recorded arguments as labelled pieces of text to read (``result_text``
    each): a plain JSON object (arguments by name, a tool's named outputs) one piece per entry,
    labelled with its name; anything else (a conversation such as a model's response, a
    string, a list, a value the codec tagged, a redacted one) one piece without a label."""
    if isinstance(value, dict) and value and "$t" not in value and _messages(value) is None:
        return [(str(name), result_text(item, limit=limit)) for name, item in value.items()]
    return [(None, result_text(value, limit=limit))]

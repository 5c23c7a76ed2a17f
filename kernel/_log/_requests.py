"""Requests for input from outside a workflow, and the responses that answer them.

``ctx.request_info(data, response_type)`` makes a ``PendingRequest`` (logged as
``InfoRequested``); once its superstep commits it waits, across runs and processes, until
``run(responses={request_id: value})`` records a ``ResponseReceived``. The run that records it
delivers a ``Response`` to the requesting executor, whose ``@response_handler`` for the request's
and the response's types receives ``(original_request, response, ctx)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PendingRequest", "Response"]


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request that counts (its superstep committed) and has no response yet.

    ``data`` is the request as the executor made it (decoded from the log when rebuilt);
    ``response_type`` names the type it asked for.
    """

    request_id: str
    executor_id: str
    data: Any
    response_type: str
    run_id: str
    superstep_id: str


@dataclass(frozen=True, slots=True)
class Response:
    """What a requesting executor receives in its inbox: its request and the response to it."""

    request: PendingRequest
    value: Any

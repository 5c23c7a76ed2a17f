"""The one exception tree of steplog.

Every error that steplog raises on its own account derives from ``StepLogError``::

    StepLogError
    ├── DefinitionError              a workflow graph that cannot run (raised by build()), or a
    │                                bad handler (raised when it is defined); also a ValueError
    ├── ExecutionError               a run that cannot go on
    │   ├── RunInProgressError       a second run on an instance that is still running one
    │   ├── ConvergenceError         more supersteps than max_supersteps
    │   ├── StateWriteRejectedError  a write to a superstep that is already closed
    │   ├── RoutingError             a message that no edge can deliver
    │   ├── ResumeError              a checkpoint or run that cannot be continued (names why)
    │   └── ResponseError            a response to a request that is unknown, answered or mistyped
    ├── RecordedError                an exception as the log recorded it, in a replayed stream
    │                                (kernel._replay: it carries the recorded ErrorInfo)
    ├── EncodingError                a value or message that cannot be stored as JSON
    ├── StoreError                   anything the event store could not do
    │   ├── StoreConfigError         a store URL or option that is wrong
    │   ├── StoreUnavailableError    a server that cannot be reached, a file that cannot be opened
    │   │   └── StoreNotFoundError   a store that does not exist (opened with create=False)
    │   ├── InvalidBatchError        an append whose events do not fit its stream and version
    │   ├── ConcurrencyConflictError an append whose expected version was not the stream's version
    │   ├── DecodeError              a stored event that cannot be read back
    │   │   └── MissingKeyError      a sealed row or view document whose key was not given
    │   └── SchemaVersionError       a database or event written by a newer steplog
    ├── ProjectionError              a view that cannot be built or queried
    ├── VisualizationError           a picture of a graph that cannot be made (WorkflowViz)
    │   └── GraphvizNotFoundError    Graphviz's dot program is not installed (an ImportError)
    └── LogIntegrityError            a log that was altered (its hash chain or a seal is broken),
                                     or that breaks the kernel's own invariants; a StoreError
                                     and a ProjectionError both, for readers of either

Errors from sqlite3, psycopg and eventsourcing are translated into this tree at the store's edge,
by class, through one table (``kernel._store``); the driver's exception is kept as ``__cause__``.

Every class here reports ``kernel`` as its ``__module__`` (the package that exports it), so logs
and ``ErrorInfo.of`` record ``kernel.StoreError``, never a private module path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = [
    "ConcurrencyConflictError",
    "ConvergenceError",
    "DecodeError",
    "DefinitionError",
    "EncodingError",
    "ExecutionError",
    "GraphvizNotFoundError",
    "InvalidBatchError",
    "LogIntegrityError",
    "MissingKeyError",
    "ProjectionError",
    "ResponseError",
    "ResumeError",
    "RoutingError",
    "RunInProgressError",
    "SchemaVersionError",
    "StateWriteRejectedError",
    "StepLogError",
    "StoreConfigError",
    "StoreError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "VisualizationError",
]


class StepLogError(Exception):
    """Root of every error raised by steplog itself."""


class DefinitionError(StepLogError, ValueError):
    """The workflow graph is not valid: unknown executors, duplicate edges, unreachable handlers;
    or a handler is (a bad signature, raised when it is defined; no handler, or two for one type,
    raised when the executor is made; a type the log cannot store, raised by ``build()``). A
    ``ValueError``, as AF raises for the same mistakes."""


class ExecutionError(StepLogError, RuntimeError):
    """A run cannot go on."""


class RunInProgressError(ExecutionError):
    """A workflow instance runs one run at a time; another one is still open.

    When another process holds the instance's lease, ``holder`` names it (``host:pid/token``) and
    ``expires`` is when its lease runs out unless renewed (aware, UTC); both are ``None`` when the
    other run is in this process (a workflow object still running one).
    """

    def __init__(
        self, message: str, *, holder: str | None = None, expires: datetime | None = None
    ) -> None:
        super().__init__(message)
        self.holder = holder
        self.expires = expires

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword attributes survive pickling (a worker process reporting the error to another).
        return (_run_in_progress, (str(self), self.holder, self.expires))


class ConvergenceError(ExecutionError):
    """The run did not finish within ``max_supersteps`` supersteps."""


class StateWriteRejectedError(ExecutionError):
    """A state write was attempted on a superstep that has already been committed or aborted."""


class RoutingError(ExecutionError):
    """A message was sent that no edge of the graph can deliver."""


class ResumeError(ExecutionError):
    """A run cannot be continued from the log: an unknown checkpoint or run, a checkpoint that is
    not the instance's latest committed superstep (fork it instead), nothing left to do, or a log
    that names executors the workflow no longer has. Nothing was appended."""


class ResponseError(ExecutionError):
    """A response was refused: its request is unknown or already answered, or the value is not of
    a type the requesting executor's response handlers accept. Nothing was appended."""


class EncodingError(StepLogError, TypeError):
    """A value cannot be encoded as JSON for the log. The message names the key and the type."""


class StoreError(StepLogError):
    """The event store could not do what was asked."""


class StoreConfigError(StoreError, ValueError):
    """A store URL or option is wrong."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached: server down, file not writable, database missing."""


class StoreNotFoundError(StoreUnavailableError):
    """The store does not exist and was not created: no file, tables or schema, opened with
    ``create=False``; or a PostgreSQL database that does not exist (steplog creates schemas,
    never databases). Nothing was created."""


class InvalidBatchError(StoreError, ValueError):
    """An append's events do not fit the call: another instance's event, positions that do not
    follow ``expected_version``, or a negative ``expected_version``. Nothing was written."""


class ConcurrencyConflictError(StoreError):
    """An append's expected version did not match the stream. Nothing was written."""

    def __init__(self, instance_id: str, expected_version: int, actual_version: int | None) -> None:
        self.instance_id = instance_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        actual = "unknown" if actual_version is None else str(actual_version)
        super().__init__(
            f"stream {instance_id!r} is at version {actual}, not at the expected version "
            f"{expected_version}; another writer appended first. Nothing was written: "
            "re-read the stream and retry"
        )


class DecodeError(StoreError):
    """A stored event could not be decoded."""


class MissingKeyError(DecodeError):
    """A row or view document is encrypted with a key that is not in the store's keyring (or the
    store was opened without keys). The message names where and the key's fingerprint."""


class SchemaVersionError(StoreError):
    """The database or an event was written by a newer version of steplog."""


class ProjectionError(StepLogError):
    """A projection or materialized view could not be built or queried."""


class VisualizationError(StepLogError, ValueError):
    """``WorkflowViz`` cannot make the picture asked for: an unknown format, a file name of
    another format, or Graphviz failing on it."""


class GraphvizNotFoundError(VisualizationError, ImportError):
    """Rendering SVG, PNG or PDF needs Graphviz's ``dot`` program, and it is not installed. An
    ``ImportError`` too, as Agent Framework raises, so ``except ImportError`` in its samples
    still catches it."""


class LogIntegrityError(StoreError, ProjectionError):
    """The log was altered since it was written (an event that does not match its hash, a
    missing or moved row, a truncated tail, a sealed row that does not open), or contradicts an
    invariant the kernel enforces (say, a commit marker that the fold did not take as a commit).

    ``instance_id`` and ``position`` name the first bad place when there is one, ``kind`` what
    is wrong there (``"edited"``, ``"gap"``, ``"reordered"``, ``"truncated"``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        instance_id: str | None = None,
        position: int | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.instance_id = instance_id
        self.position = position
        self.kind = kind

    def __reduce__(self) -> Any:
        return (_integrity, (str(self), self.instance_id, self.position, self.kind))


def _integrity(
    message: str, instance_id: str | None, position: int | None, kind: str | None
) -> LogIntegrityError:
    """Rebuild a pickled ``LogIntegrityError`` with its attributes."""
    return LogIntegrityError(message, instance_id=instance_id, position=position, kind=kind)


def _run_in_progress(
    message: str, holder: str | None, expires: datetime | None
) -> RunInProgressError:
    """Rebuild a pickled ``RunInProgressError`` with its attributes."""
    return RunInProgressError(message, holder=holder, expires=expires)


for _name in __all__:
    globals()[_name].__module__ = "kernel"
del _name

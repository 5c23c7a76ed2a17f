"""The one exception tree of steplog.

Every error that steplog raises on its own account derives from ``StepLogError``::

    StepLogError
    ├── DefinitionError              a workflow graph that cannot run (raised by build()), or a
    │   │                            bad handler (raised when it is defined); also a ValueError
    │   └── WorkflowValidationError  one with a ValidationTypeEnum category (AF's names)
    │       ├── EdgeDuplicationError     the same source -> target edge twice
    │       ├── TypeCompatibilityError   an edge whose source never sends what its target takes
    │       └── GraphConnectivityError   an executor no edge from the start reaches, or unknown
    ├── ExecutionError               a run that cannot go on
    │   ├── RunInProgressError       a second run on an instance that is still running one
    │   ├── ConvergenceError         more supersteps than max_supersteps
    │   ├── StateWriteRejectedError  a write to a superstep that is already closed
    │   ├── RoutingError             a message that no edge can deliver
    │   ├── ResumeError              a checkpoint or run that cannot be continued (names why)
    │   ├── ResponseError            a response to a request that is unknown, answered or mistyped
    │   ├── PendingRequestsError     a new message while requests or responses still wait
    │   └── WorkflowArgumentError    a functional workflow's call with arguments it refuses, as
    │                                AF refuses them with ValueError (so a ValueError too)
    ├── RecordedError                an exception as the log recorded it, in a replayed stream
    │                                (kernel._ops._replay: it carries the recorded ErrorInfo)
    ├── EncodingError                a value or message that cannot be stored as JSON
    ├── StoreError                   anything the event store could not do
    │   ├── StoreConfigError         a store URL or option that is wrong
    │   ├── StoreUnavailableError    a server that cannot be reached, a file that cannot be opened
    │   │   ├── StoreBusyError       a lock held past the wait, or a connection lost: retry
    │   │   ├── StoreNotFoundError   a store that does not exist (opened with create=False)
    │   │   └── StoreDamagedError    a database file that is damaged (not retried)
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
by class, through one table (``_store._eventstore``); the driver's exception is kept as
``__cause__``.

Every class here reports ``kernel`` as its ``__module__`` (the package that exports it), so logs
and ``ErrorInfo.of`` record ``kernel.StoreError``, never a private module path.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

__all__ = [
    "ConcurrencyConflictError",
    "ConvergenceError",
    "DecodeError",
    "DefinitionError",
    "EdgeDuplicationError",
    "EncodingError",
    "ExecutionError",
    "GraphConnectivityError",
    "GraphvizNotFoundError",
    "InvalidBatchError",
    "LogIntegrityError",
    "MissingKeyError",
    "PendingRequestsError",
    "ProjectionError",
    "ResponseError",
    "ResumeError",
    "RoutingError",
    "RunInProgressError",
    "SchemaVersionError",
    "StateWriteRejectedError",
    "StepLogError",
    "StoreBusyError",
    "StoreConfigError",
    "StoreDamagedError",
    "StoreError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "TypeCompatibilityError",
    "ValidationTypeEnum",
    "VisualizationError",
    "WorkflowArgumentError",
    "WorkflowValidationError",
]


class StepLogError(Exception):
    """Root of every error raised by steplog itself."""


class ValidationTypeEnum(enum.Enum):
    """What kind of mistake a ``WorkflowValidationError`` reports (AF's categories, by the same
    names and values, and ``EDGE_GROUP`` of steplog's own)."""

    EDGE_DUPLICATION = "EDGE_DUPLICATION"
    """The same ``source -> target`` edge twice, in one edge group or in two."""
    EXECUTOR_DUPLICATION = "EXECUTOR_DUPLICATION"
    """Two different executor objects with the same id."""
    TYPE_COMPATIBILITY = "TYPE_COMPATIBILITY"
    """An edge, or a handler, that can never carry or receive a message, by the declared types."""
    GRAPH_CONNECTIVITY = "GRAPH_CONNECTIVITY"
    """An executor the start executor's edges never reach, or an id the builder does not know."""
    HANDLER_OUTPUT_ANNOTATION = "HANDLER_OUTPUT_ANNOTATION"
    """A handler whose ``WorkflowContext`` annotation is wrong."""
    OUTPUT_VALIDATION = "OUTPUT_VALIDATION"
    """A designation of output executors that cannot hold."""
    EDGE_GROUP = "EDGE_GROUP"
    """steplog's: an edge group of the wrong shape (a switch-case without ``Default``, an empty
    fan-out, a chain of one). AF raises a plain ``ValueError`` for these."""


class DefinitionError(StepLogError, ValueError):
    """The workflow graph is not valid: unknown executors, duplicate edges, unreachable handlers;
    or a handler is (a bad signature, raised when it is defined; no handler, or two for one type,
    raised when the executor is made; a type the log cannot store, raised by ``build()``). A
    ``ValueError``, as AF raises for the same mistakes.

    ``validation_type`` is the ``ValidationTypeEnum`` of a graph mistake (set on every
    ``WorkflowValidationError``), None for other bad definitions (a bad option value).
    """

    validation_type: ValidationTypeEnum | None = None


class WorkflowValidationError(DefinitionError):
    """A graph mistake found when it is built, with its category (``validation_type``).

    ``message`` is the text without the category; ``str()`` shows ``[CATEGORY] message``, as AF's
    error of the same name does. The subclasses carry AF's attributes.
    """

    validation_type: ValidationTypeEnum

    def __init__(self, message: str, validation_type: ValidationTypeEnum) -> None:
        super().__init__(message)
        self.message = message
        self.validation_type = validation_type

    def __str__(self) -> str:
        return f"[{self.validation_type.value}] {self.message}"

    def __reduce__(self) -> Any:
        # The subclasses take other arguments: rebuild from the attributes, whatever they are.
        return (_validation_error, (type(self), self.message, dict(self.__dict__)))


class EdgeDuplicationError(WorkflowValidationError):
    """An edge ``edge_id`` (``"source->target"``) was added twice."""

    def __init__(self, edge_id: str, message: str | None = None) -> None:
        super().__init__(
            message or f"duplicate edge {edge_id}: each edge of the workflow must be unique",
            ValidationTypeEnum.EDGE_DUPLICATION,
        )
        self.edge_id = edge_id


class TypeCompatibilityError(WorkflowValidationError):
    """The edge ``source_executor_id -> target_executor_id`` can never deliver: the source sends
    ``source_types``, and the target's handlers take ``target_types``."""

    def __init__(
        self,
        source_executor_id: str,
        target_executor_id: str,
        source_types: list[Any],
        target_types: list[Any],
        message: str | None = None,
    ) -> None:
        super().__init__(
            message
            or (
                f"edge {source_executor_id!r} -> {target_executor_id!r} can never deliver: the "
                f"source sends {_names(source_types)}, the target takes {_names(target_types)}"
            ),
            ValidationTypeEnum.TYPE_COMPATIBILITY,
        )
        self.source_executor_id = source_executor_id
        self.target_executor_id = target_executor_id
        self.source_types = source_types
        self.target_types = target_types


class GraphConnectivityError(WorkflowValidationError):
    """An executor that no chain of edges from the start executor reaches (it would never run),
    or an executor id the builder was never given."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ValidationTypeEnum.GRAPH_CONNECTIVITY)


def _names(kinds: list[Any]) -> str:
    return ", ".join(getattr(k, "__qualname__", repr(k)) for k in kinds) or "nothing"


def _validation_error(
    cls: type[WorkflowValidationError], message: str, attributes: dict[str, Any]
) -> WorkflowValidationError:
    """Rebuild a pickled ``WorkflowValidationError`` (of any subclass) with its attributes."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(attributes)
    return error


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
    """A message was sent that no edge of the graph can deliver, in a workflow built with
    ``strict_routing=True`` (else the message is dropped, and the drop recorded); or a run's
    input that the start executor has no handler for."""


class ResumeError(ExecutionError):
    """A run cannot be continued from the log: an unknown checkpoint or run, a checkpoint that is
    not the instance's latest committed superstep (fork it instead), nothing left to do, or a log
    that names executors the workflow no longer has. Nothing was appended."""


class ResponseError(ExecutionError):
    """A response was refused: its request is unknown or already answered, or the value is not of
    a type the requesting executor's response handlers accept. Nothing was appended."""


class PendingRequestsError(ExecutionError):
    """A run with a new message was refused: something still waits on the instance's last run,
    and a run that continues nothing would drop it. ``request_ids`` names the requests waiting
    for a response; ``responded_ids`` the requests whose responses were recorded (``steplog
    respond``, ``record_response``) and wait for ``resume()`` to deliver them. The message says
    how to go on with them (``run(responses=...)``, ``resume()``) or to start the run anyway
    (``run(message, supersede_requests=True)``). Nothing was appended."""

    def __init__(
        self,
        message: str,
        *,
        request_ids: tuple[str, ...] = (),
        responded_ids: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.request_ids = request_ids
        self.responded_ids = responded_ids

    def __reduce__(self) -> tuple[Any, ...]:
        return (_pending_requests, (str(self), self.request_ids, self.responded_ids))


def _pending_requests(
    message: str, request_ids: tuple[str, ...], responded_ids: tuple[str, ...] = ()
) -> PendingRequestsError:
    return PendingRequestsError(message, request_ids=request_ids, responded_ids=responded_ids)


class WorkflowArgumentError(ExecutionError, ValueError):
    """A functional workflow refused a call's arguments where Agent Framework raises
    ``ValueError``: ``run()`` given a message and responses (or neither), responses that answer
    no pending request, a response of the wrong type, an unknown ``checkpoint_id``, a reserved
    state key. Raised before anything is appended, except the response type, which a
    ``RunContext.request_info`` may only learn inside its run (the run then fails)."""


class EncodingError(StepLogError, TypeError):
    """A value cannot be encoded as JSON for the log. The message names the key and the type."""


class StoreError(StepLogError):
    """The event store could not do what was asked."""


class StoreConfigError(StoreError, ValueError):
    """A store URL or option is wrong."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached: server down, file not writable, database missing."""


class StoreBusyError(StoreUnavailableError):
    """Another writer held a lock on the database for longer than this process waits (SQLite's
    busy or locked; PostgreSQL's lock not available, deadlock, serialization failure), no pooled
    connection came free in time, or the connection was lost or could not be made: the one kind
    of unavailability that retrying soon may cure, so ``Projector.follow`` waits and retries it.
    A file that is not writable, a full disk or a store opened read-only is a
    ``StoreUnavailableError`` but not this: waiting will not help."""


class StoreNotFoundError(StoreUnavailableError):
    """The store does not exist and was not created: no file, tables or schema, opened with
    ``create=False``; or a PostgreSQL database that does not exist (steplog creates schemas,
    never databases). Nothing was created."""


class StoreDamagedError(StoreUnavailableError):
    """The store's database is damaged: a file that is not a SQLite database, or whose pages are
    malformed (SQLite's ``SQLITE_NOTADB``, ``SQLITE_CORRUPT``), or data PostgreSQL reports
    corrupted (SQLSTATE ``XX001``, ``XX002``). Waiting does not help, so nothing retries it
    (``steplog project --follow`` stops with it); restore the store from a backup. The message
    names the file (or the database). ``detects`` is the one rule that tells such an error."""

    SQLITE_CODES = frozenset({11, 26})
    """SQLite's primary result codes of damage: ``SQLITE_CORRUPT``, ``SQLITE_NOTADB``."""
    SQLSTATES = frozenset({"XX001", "XX002"})
    """PostgreSQL's SQLSTATEs of damage: ``data_corrupted``, ``index_corrupted``."""

    @classmethod
    def detects(cls, error: BaseException) -> bool:
        """Whether ``error``, or an error it was raised from, is a driver's report of a damaged
        database: by its SQLite result code (extended codes keep the primary one in the low byte)
        or its PostgreSQL SQLSTATE, never by its message text."""
        seen: BaseException | None = error
        for _ in range(8):  # a cause chain is short; never loop on a cycle
            if seen is None:
                return False
            code = getattr(seen, "sqlite_errorcode", None)
            if isinstance(code, int) and code & 0xFF in cls.SQLITE_CODES:
                return True
            if getattr(seen, "sqlstate", None) in cls.SQLSTATES:
                return True
            seen = seen.__cause__ or seen.__context__
        return False


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
    store was opened without keys). The message names where and the key's fingerprint.

    ``where`` names the value (``"row 'orders'#1..2"``), ``key`` the fingerprint (hex) of the
    key it needs (None when not known), ``given`` the fingerprints of the keys the store was
    given (empty: none): enough for a tool to say it in its own words (the CLI names its
    ``--keys-file``), never a key itself.
    """

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        key: str | None = None,
        given: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.where = where
        self.key = key
        self.given = given

    def __reduce__(self) -> Any:
        return (_missing_key, (str(self), self.where, self.key, self.given))


def _missing_key(
    message: str, where: str | None, key: str | None, given: tuple[str, ...]
) -> MissingKeyError:
    """Rebuild a pickled ``MissingKeyError`` with its attributes."""
    return MissingKeyError(message, where=where, key=key, given=given)


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

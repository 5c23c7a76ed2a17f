"""steplog's kernel: typed events, the event store, and the superstep runner.

Ported from Microsoft Agent Framework workflows by changing imports::

    from kernel import Executor, WorkflowBuilder, WorkflowContext, handler, open_store
"""

import contextlib as _contextlib
import inspect as _inspect
import typing as _typing

from kernel._base._clock import Clock, IdFactory, counter_ids, system_clock, uuid_ids
from kernel._base._errors import (
    ConcurrencyConflictError,
    ConvergenceError,
    DecodeError,
    DefinitionError,
    EdgeDuplicationError,
    EncodingError,
    ExecutionError,
    GraphConnectivityError,
    GraphvizNotFoundError,
    InvalidBatchError,
    LogIntegrityError,
    MissingKeyError,
    PendingRequestsError,
    ProjectionError,
    ResponseError,
    ResumeError,
    RoutingError,
    RunInProgressError,
    SchemaVersionError,
    StateWriteRejectedError,
    StepLogError,
    StoreBusyError,
    StoreConfigError,
    StoreDamagedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
    TypeCompatibilityError,
    ValidationTypeEnum,
    VisualizationError,
    WorkflowArgumentError,
    WorkflowValidationError,
)
from kernel._base._ids import MAX_ID_BYTES, MAX_KEY_BYTES
from kernel._codec._chain import ChainHead, ChainProblem, ChainReport
from kernel._codec._cipher import FROM_ENV, KEYS_ENV, Keyring
from kernel._codec._values import ValueCodec
from kernel._define._context import WorkflowContext
from kernel._define._executor import Executor, WorkflowMessage, handler, response_handler
from kernel._define._functions import FunctionExecutor, executor
from kernel._define._graph import Case, Default
from kernel._define._signatures import HandlerSpec, ResponseHandlerSpec
from kernel._define._step import StepWrapper, report_usage, step, step_key
from kernel._define._stream import (
    FRAMEWORK_EVENT_TYPES,
    WorkflowErrorDetails,
    WorkflowEvent,
    WorkflowEventSource,
    WorkflowEventType,
    WorkflowRunState,
)
from kernel._log._events import (
    EVENT_TYPES,
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    AbortReason,
    CustomEventAdded,
    DropReason,
    ErrorInfo,
    Event,
    EventBase,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    InfoRequested,
    InstanceForked,
    MessageStaged,
    OutputYielded,
    ResponseReceived,
    RunAbandoned,
    RunAwaitingInput,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StateStaged,
    StepRecorded,
    SubworkflowRan,
    SubworkflowStarted,
    SuperstepAborted,
    SuperstepCommitted,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._log._fold import (
    CommittedState,
    Fold,
    OpenRun,
    SuperstepFold,
    apply_committed,
    fold_committed,
    folds,
)
from kernel._log._requests import PendingRequest
from kernel._ops._builder import WorkflowBuilder
from kernel._ops._checkpoint_status import (
    LoggedCheckpoint,
    checkpoint_statuses,
    logged_checkpoints,
)
from kernel._ops._functional import (
    FunctionalRunStream,
    FunctionalWorkflow,
    FunctionalWorkflowDefinition,
    workflow,
)
from kernel._ops._recovery import RecoveredRun, recover
from kernel._ops._replay import RecordedError, replay
from kernel._ops._rerun import Divergence, DivergenceKind, RerunReport, rerun
from kernel._ops._respond import RecordedResponse, fork_at, record_response
from kernel._ops._runcontext import RunContext, get_run_context
from kernel._ops._settings import InstanceSettings
from kernel._ops._subworkflow import (
    SubworkflowLinks,
    SubWorkflowRequestMessage,
    SubWorkflowResponseMessage,
    WorkflowExecutor,
)
from kernel._run._hooks import RunHooks, RunInfo, StepInfo, SuperstepInfo
from kernel._run._ledger import Checkpoint, CheckpointStatus
from kernel._run._runner import RunResult
from kernel._store._eventstore import EventStore
from kernel._store._factory import DEFAULT_STORE_ENV, open_store
from kernel._store._lease import Lease
from kernel._store._records import Recorded
from kernel._store._rekey import RekeyReport, compact_store, rekey

if _typing.TYPE_CHECKING:
    from kernel._store._memory import MemoryStore
    from kernel._store._postgres import PostgresStore
    from kernel._store._sqlite import SQLiteStore
from kernel._base._urls import mask_url
from kernel._define._viz import WorkflowViz
from kernel._ops._workflow import RunStream, Workflow

__all__ = [
    "DEFAULT_STORE_ENV",
    "EVENT_TYPES",
    "FRAMEWORK_EVENT_TYPES",
    "FROM_ENV",
    "KEYS_ENV",
    "MAX_ID_BYTES",
    "MAX_KEY_BYTES",
    "RUN_END_TYPES",
    "SUPERSTEP_MARKER_TYPES",
    "AbortReason",
    "Case",
    "ChainHead",
    "ChainProblem",
    "ChainReport",
    "Checkpoint",
    "CheckpointStatus",
    "Clock",
    "CommittedState",
    "ConcurrencyConflictError",
    "ConvergenceError",
    "CustomEventAdded",
    "DecodeError",
    "Default",
    "DefinitionError",
    "Divergence",
    "DivergenceKind",
    "DropReason",
    "EdgeDuplicationError",
    "EncodingError",
    "ErrorInfo",
    "Event",
    "EventBase",
    "EventStore",
    "ExecutionError",
    "Executor",
    "ExecutorCompleted",
    "ExecutorFailed",
    "ExecutorInvoked",
    "Fold",
    "FunctionExecutor",
    "FunctionalRunStream",
    "FunctionalWorkflow",
    "FunctionalWorkflowDefinition",
    "GraphConnectivityError",
    "GraphvizNotFoundError",
    "HandlerSpec",
    "IdFactory",
    "InfoRequested",
    "InstanceForked",
    "InstanceSettings",
    "InvalidBatchError",
    "Keyring",
    "Lease",
    "LogIntegrityError",
    "LoggedCheckpoint",
    "MemoryStore",
    "MessageStaged",
    "MissingKeyError",
    "OpenRun",
    "OutputYielded",
    "PendingRequest",
    "PendingRequestsError",
    "PostgresStore",
    "ProjectionError",
    "Recorded",
    "RecordedError",
    "RecordedResponse",
    "RecoveredRun",
    "RekeyReport",
    "RerunReport",
    "ResponseError",
    "ResponseHandlerSpec",
    "ResponseReceived",
    "ResumeError",
    "RoutingError",
    "RunAbandoned",
    "RunAwaitingInput",
    "RunCancelled",
    "RunCompleted",
    "RunContext",
    "RunEvent",
    "RunFailed",
    "RunHooks",
    "RunInProgressError",
    "RunInfo",
    "RunResult",
    "RunStarted",
    "RunStream",
    "SQLiteStore",
    "SchemaVersionError",
    "StateStaged",
    "StateWriteRejectedError",
    "StepInfo",
    "StepLogError",
    "StepRecorded",
    "StepWrapper",
    "StoreBusyError",
    "StoreConfigError",
    "StoreDamagedError",
    "StoreError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "SubWorkflowRequestMessage",
    "SubWorkflowResponseMessage",
    "SubworkflowLinks",
    "SubworkflowRan",
    "SubworkflowStarted",
    "SuperstepAborted",
    "SuperstepCommitted",
    "SuperstepEvent",
    "SuperstepFold",
    "SuperstepInfo",
    "SuperstepStarted",
    "TypeCompatibilityError",
    "ValidationTypeEnum",
    "ValueCodec",
    "VisualizationError",
    "Workflow",
    "WorkflowArgumentError",
    "WorkflowBuilder",
    "WorkflowContext",
    "WorkflowErrorDetails",
    "WorkflowEvent",
    "WorkflowEventSource",
    "WorkflowEventType",
    "WorkflowExecutor",
    "WorkflowMessage",
    "WorkflowRunState",
    "WorkflowValidationError",
    "WorkflowViz",
    "apply_committed",
    "checkpoint_statuses",
    "compact_store",
    "counter_ids",
    "executor",
    "fold_committed",
    "folds",
    "fork_at",
    "get_run_context",
    "handler",
    "logged_checkpoints",
    "mask_url",
    "open_store",
    "record_response",
    "recover",
    "rekey",
    "replay",
    "report_usage",
    "rerun",
    "response_handler",
    "step",
    "step_key",
    "system_clock",
    "uuid_ids",
    "workflow",
]


def _publish(cls: type) -> None:
    """Make ``cls`` report this package as its module (``kernel.Workflow``, not the private module
    that defines it), so that reprs, pickles and error records name the public path, and the value
    codec stores ``kernel:Qualname``, which moving a module does not change (the names values were
    stored under before are read through ``kernel._codec._renamed``).

    Its own annotations are resolved first, where it is defined: ``typing.get_type_hints`` looks
    the names of string annotations up in the module ``__module__`` names."""
    if cls.__module__ == __name__:
        return
    own = _inspect.get_annotations(cls)
    if any(isinstance(hint, str) for hint in own.values()):
        with _contextlib.suppress(NameError):  # unresolvable anywhere: left as it was
            hints = _typing.get_type_hints(cls, include_extras=True)
            cls.__annotations__ = {name: hints.get(name, hint) for name, hint in own.items()}
    cls.__module__ = __name__


for _name in __all__:
    if isinstance(globals().get(_name), type):
        _publish(globals()[_name])
del _name

_ADAPTERS = {
    "MemoryStore": "kernel._store._memory",
    "PostgresStore": "kernel._store._postgres",
    "SQLiteStore": "kernel._store._sqlite",
}


def __getattr__(name: str) -> _typing.Any:
    """The store adapters, imported on first use: ``import kernel`` does not load every driver
    (psycopg, filelock) whether or not its backend is used."""
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernel' has no attribute {name!r}")
    import importlib

    adapter = getattr(importlib.import_module(module), name)
    _publish(adapter)
    globals()[name] = adapter
    return adapter

"""steplog's projections: pure folds of the log, and materialized views kept next to the store.

Pure folds work on a list of one instance's events read from any store (``store.read(id)``):
committed state (the kernel's own fold, re-exported here), run history (with lineage: resumed
runs, pending requests, forks; ``history_of`` adds an instance's forks from a store, and
``subworkflows_of``/``parent_of`` walk between a parent superstep and its sub-workflows), key
provenance (of every key, or of a few read from a store with ``blame_keys``), time travel, diff
and bisect; a run's recorded steps beside their supersteps' verdicts (``recorded_steps``).
``SensitiveKeys`` shows any of these answers with the values of sensitive keys redacted.
``Projector`` keeps views in tables with exactly-once tracking; ``TimeTravel`` answers
time-travel questions from a store, starting from snapshots.
See ``docs/projections.md``.
"""

import contextlib as _contextlib
import inspect as _inspect
import typing as _typing

from kernel import CommittedState, apply_committed, fold_committed
from projections._folds._bisect import BisectResult, bisect
from projections._folds._blame import (
    KeyBlame,
    MemoryWriteRows,
    WriteRecord,
    WriteRows,
    WriteStatus,
    fold_blame,
)
from projections._folds._diff import Change, StateDiff, diff, diff_points
from projections._folds._history import RunHistory, fold_history
from projections._folds._lineage import (
    LinkVerdict,
    SubworkflowLink,
    forks_of,
    history_of,
    parent_of,
    subworkflows_of,
)
from projections._folds._redact import (
    REDACTED,
    SENSITIVE_TYPES,
    SensitiveKeys,
    declared_patterns,
    is_redacted,
    sensitive_keys_of,
)
from projections._folds._runrecords import (
    DroppedMessage,
    ForkRecord,
    HistoryRows,
    MemoryHistoryRows,
    RequestRecord,
    RunRecord,
    RunStatus,
    SuperstepRecord,
)
from projections._folds._steps import RecordedStep, recorded_steps
from projections._folds._timetravel import (
    AtPosition,
    AtSuperstep,
    AtTime,
    InsideSuperstep,
    Point,
    StateAt,
    state_at,
)
from projections._views._backend_for import backend_for
from projections._views._backends import MemoryViewBackend, ViewBackend, ViewTx
from projections._views._keyblame import BLAME_TYPES, blame_keys, key_index_position
from projections._views._postgres import PostgresViewBackend
from projections._views._projector import (
    VIEW_NAMES,
    Projector,
    VerifyReport,
    default_views,
    run_follower,
)
from projections._views._reseal import ResealReport, reseal_views
from projections._views._snapshots import SnapshotView, TimeTravel
from projections._views._sqlite import SQLiteViewBackend
from projections._views._viewspecs import (
    BlameView,
    DocumentView,
    HistoryView,
    KeyIndexView,
    StateView,
    ViewSpec,
)

__all__ = [
    "BLAME_TYPES",
    "REDACTED",
    "SENSITIVE_TYPES",
    "VIEW_NAMES",
    "AtPosition",
    "AtSuperstep",
    "AtTime",
    "BisectResult",
    "BlameView",
    "Change",
    "CommittedState",
    "DocumentView",
    "DroppedMessage",
    "ForkRecord",
    "HistoryRows",
    "HistoryView",
    "InsideSuperstep",
    "KeyBlame",
    "KeyIndexView",
    "LinkVerdict",
    "MemoryHistoryRows",
    "MemoryViewBackend",
    "MemoryWriteRows",
    "Point",
    "PostgresViewBackend",
    "Projector",
    "RecordedStep",
    "RequestRecord",
    "ResealReport",
    "RunHistory",
    "RunRecord",
    "RunStatus",
    "SQLiteViewBackend",
    "SensitiveKeys",
    "SnapshotView",
    "StateAt",
    "StateDiff",
    "StateView",
    "SubworkflowLink",
    "SuperstepRecord",
    "TimeTravel",
    "VerifyReport",
    "ViewBackend",
    "ViewSpec",
    "ViewTx",
    "WriteRecord",
    "WriteRows",
    "WriteStatus",
    "apply_committed",
    "backend_for",
    "bisect",
    "blame_keys",
    "declared_patterns",
    "default_views",
    "diff",
    "diff_points",
    "fold_blame",
    "fold_committed",
    "fold_history",
    "forks_of",
    "history_of",
    "is_redacted",
    "key_index_position",
    "parent_of",
    "recorded_steps",
    "reseal_views",
    "run_follower",
    "sensitive_keys_of",
    "state_at",
    "subworkflows_of",
]

# Every exported class reports this package as its module, as the kernel's do (see
# ``kernel._publish``): its annotations resolved first where they were written. The kernel's
# classes exported here again keep ``kernel``.
for _cls in [globals()[name] for name in __all__]:
    if isinstance(_cls, type) and _cls.__module__.startswith(f"{__name__}."):
        with _contextlib.suppress(NameError):
            _hints = _typing.get_type_hints(_cls, include_extras=True)
            _cls.__annotations__ = {
                k: _hints.get(k, v) for k, v in _inspect.get_annotations(_cls).items()
            }
        _cls.__module__ = __name__
del _cls

"""steplog's projections: pure folds of the log, and materialized views kept next to the store.

Pure folds work on a list of one instance's events read from any store (``store.read(id)``):
committed state (the kernel's own fold, re-exported here), run history, key provenance (of every
key, or of a few read from a store with ``blame_keys``), time travel, diff and bisect.
``Projector`` keeps views in tables with exactly-once tracking; ``TimeTravel`` answers
time-travel questions from a store, starting from snapshots.
See ``docs/projections.md``.
"""

from kernel._fold import CommittedState, apply_committed, fold_committed
from projections._backends import (
    MemoryViewBackend,
    PostgresViewBackend,
    SQLiteViewBackend,
    ViewBackend,
    ViewTx,
    backend_for,
)
from projections._bisect import BisectResult, bisect
from projections._blame import KeyBlame, WriteRecord, WriteStatus, fold_blame
from projections._diff import Change, StateDiff, diff, diff_points
from projections._history import RunHistory, RunRecord, RunStatus, SuperstepRecord, fold_history
from projections._keyblame import BLAME_TYPES, blame_keys
from projections._snapshots import SnapshotView, TimeTravel
from projections._timetravel import (
    AtPosition,
    AtSuperstep,
    AtTime,
    InsideSuperstep,
    Point,
    StateAt,
    state_at,
)
from projections._views import VIEW_NAMES, Projector, VerifyReport, default_views, run_follower
from projections._viewspecs import BlameView, DocumentView, HistoryView, StateView, ViewSpec

__all__ = [
    "BLAME_TYPES",
    "VIEW_NAMES",
    "AtPosition",
    "AtSuperstep",
    "AtTime",
    "BisectResult",
    "BlameView",
    "Change",
    "CommittedState",
    "DocumentView",
    "HistoryView",
    "InsideSuperstep",
    "KeyBlame",
    "MemoryViewBackend",
    "Point",
    "PostgresViewBackend",
    "Projector",
    "RunHistory",
    "RunRecord",
    "RunStatus",
    "SQLiteViewBackend",
    "SnapshotView",
    "StateAt",
    "StateDiff",
    "StateView",
    "SuperstepRecord",
    "TimeTravel",
    "VerifyReport",
    "ViewBackend",
    "ViewSpec",
    "ViewTx",
    "WriteRecord",
    "WriteStatus",
    "apply_committed",
    "backend_for",
    "bisect",
    "blame_keys",
    "default_views",
    "diff",
    "diff_points",
    "fold_blame",
    "fold_committed",
    "fold_history",
    "run_follower",
    "state_at",
]

"""The state and helpers every part of ``EventStore`` shares (``StoreCore``), and the store's
constants (meta keys, schema version)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

from eventsourcing.persistence import ApplicationRecorder

from kernel._base._errors import (
    LogIntegrityError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
)
from kernel._base._ids import check_id
from kernel._codec._chain import (
    ChainProblem,
    IntegrityMark,
    form_problem,
    link_problem,
)
from kernel._codec._cipher import Keyring, is_sealed
from kernel._codec._hashing import RowLink
from kernel._codec._mapper import RowMapper
from kernel._codec._values import ValueCodec
from kernel._log._events import EVENT_TYPES
from kernel._store._backend import RowBackend
from kernel._store._scan import Scan

__all__ = [
    "ENCRYPTION_MARK",
    "INTEGRITY_MARK",
    "ROWS_PER_READ",
    "STORE_SCHEMA_VERSION",
    "StoreCore",
    "newer_schema",
]


ENCRYPTION_MARK = "encryption"
"""The meta key that marks an encrypted store (its value names the cipher)."""
INTEGRITY_MARK = "integrity"
"""The meta key of the store's ``IntegrityMark``: from which row on rows must carry hashes and,
in an encrypted store, be sealed (tagged with a key of the keyring there)."""
STORE_SCHEMA_VERSION = 3
"""Version of the tables steplog writes. A database stamped with a higher one is refused.

1: one row per event. 2: one row per appended batch (``kernel._codec._mapper``). 3: batch rows carry
the hash chain, and the store keeps each chain's head. Older rows stay readable, so an older
store is read as it is and restamped by its next writer (so that an older steplog, which would
write rows without hashes after chained ones, no longer opens it)."""

ROWS_PER_READ = 128
"""Rows fetched per query of the global log, while a page fills."""


def newer_schema(stamped: object, *, where: str) -> bool:
    """Whether the schema version stamped in the meta table of the store at ``where`` is newer
    than this steplog's; a stamp that is not a whole number is a ``StoreError``."""
    text = str(stamped)
    if not (text.isascii() and text.isdigit()):
        raise StoreError(f"{where} has a malformed schema version {text!r:.40} in its meta table")
    return int(text) > STORE_SCHEMA_VERSION


class StoreCore:
    """What every part of ``EventStore`` shares: the backend, the mapper, the trust state (the
    integrity mark, whether the store is encrypted), the error edge and the checks of a row
    against the mark. ``EventStore`` is this plus its parts (``_marks``, ``_reads``,
    ``_verify``); nothing else subclasses it."""

    url: str
    """The store's URL, its password (if any) masked as ``***`` (``_base._urls.mask_url``)."""

    _closed = False
    """Set by ``close()``."""

    def __init__(self, backend: RowBackend, *, url: str, mapper: RowMapper | None = None):
        self._backend = backend
        self.shares_commits: bool = backend.shares_commits
        """Whether concurrent runs should append their commit batches through the store's
        ``group_committer()``: true where a commit costs an fsync (SQLite, PostgreSQL)."""
        self._mapper = mapper or RowMapper()
        self.codec = ValueCodec()
        """The codec shared by everything that writes or reads values through this store."""
        self.url = url
        self._closed = False
        self._insert_lock = threading.Lock()
        self._heads_cache: dict[str, tuple[int, bytes]] = {}
        """Each instance's chain head as this store last wrote it: ``(position, hash)``."""
        self._encrypted = False
        self._marks = IntegrityMark()
        """What this store's rows must be (``_settle_marks``); no rule until it is opened."""
        self._mark_problem: ChainProblem | None = None
        """What is wrong with the store's integrity mark (read with ``allow_broken_chain``)."""
        self._scan: Scan | None = None
        """The global scan the last ``read_all`` page ended (see ``read_all``)."""
        self.reads_broken_chains = False
        """Whether the store was opened with ``allow_broken_chain``: it then answers from the log
        alone, never from a snapshot (which vouches for a chain such a store does not trust)."""
        self.chain_problems: list[ChainProblem] = []
        """What reads found wrong with the chain, when opened with ``allow_broken_chain``."""
        self.stranded_leases: dict[str, str] = {}
        """Leases that a keeper of this store could not give back (a store error at release, such
        as a full disk): instance id -> holder. Such a lease belongs to a run of this process
        that has ended, so the next keeper here takes it over at once (``LeaseKeeper``) instead
        of refusing itself with ``RunInProgressError`` until the lease expires."""

    def _refuse(self, problem: ChainProblem) -> None:
        """Raise ``problem`` as a ``LogIntegrityError``, or note it when broken chains are read."""
        if self._mapper.on_broken is None:
            raise problem.error()
        self._mapper.on_broken(problem.error())

    def _form_problem(
        self, instance_id: str, link: RowLink, state: bytes, row_id: int | None = None
    ) -> ChainProblem | None:
        """What is wrong with a row that is not what the store's ``IntegrityMark`` says rows
        must be (chained after a point, sealed unless listed as written before the key), or
        None. ``row_id``: the row's id, looked up only when the chained bound is not 0 and the
        row breaks it."""
        mark = self._marks
        unsealed = not is_sealed(bytes(state)) and not mark.may_be_plain(instance_id, link.last)
        unchained = mark.chained_from is not None and link.head is None
        if not (unsealed or unchained):
            return None
        if row_id is None and unchained and mark.chained_from:
            with self._translated(f"read the row of {instance_id!r}#{link.last}"):
                row_id = self._backend.row_id(instance_id, link.last)
        found = row_id if row_id is not None else 1 << 62
        unchained = unchained and found > (mark.chained_from or 0)
        return form_problem(instance_id, link, chained=not unchained, sealed=not unsealed)

    def _check_form(
        self, instance_id: str, link: RowLink, state: bytes, row_id: int | None = None
    ) -> None:
        """Refuse (or note) a row that breaks the store's ``IntegrityMark``."""
        problem = self._form_problem(instance_id, link, state, row_id)
        if problem is not None:
            self._refuse(problem)

    def _check_links(self, instance_id: str, links: Sequence[RowLink], *, from_start: bool) -> None:
        """Check that consecutive rows of a read link up (and, read from the start, that the
        first one begins the stream): raise, or note the problem when broken chains are read."""
        before = None
        for n, link in enumerate(links):
            if n or from_start:
                problem = link_problem(instance_id, before, link)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())
            before = link

    def _note_broken(self, error: LogIntegrityError) -> None:
        problem = ChainProblem.of(error, error.instance_id or "", error.position or 0)
        if problem not in self.chain_problems:
            self.chain_problems.append(problem)

    @property
    def keyring(self) -> Keyring | None:
        """The keys this store seals and opens rows with (None: rows are plain JSON). Views
        that keep copies of values in the same database seal them with it too."""
        return self._mapper.keyring

    @property
    def encrypted(self) -> bool:
        """Whether the store is marked encrypted (its first writer with a key marked it): its
        rows are sealed, and reading them needs its keys. Known when the store is opened."""
        return self._encrypted

    @property
    def recorder(self) -> ApplicationRecorder:
        """eventsourcing's application recorder behind this store, for tools and tests that work
        on stored records (``StoredEvent``) directly, bypassing ``append``'s checks."""
        return self._backend.recorder

    @property
    def backend(self) -> RowBackend:
        """The ``RowBackend`` this store keeps its rows in (``kernel._store._backend``): for
        maintenance (``rekey``, ``compact_store``) and tests of the port itself."""
        return self._backend

    def version(self, instance_id: str) -> int:
        """The position of the stream's last event, 0 when the stream is empty."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        with self._translated(f"read the version of {instance_id!r}"):
            version = self._backend.stream_version(instance_id)
        return version

    def _version_or_none(self, instance_id: str) -> int | None:
        try:
            return self.version(instance_id)
        except StoreError:
            return None

    def instances(self) -> list[str]:
        """The ids of every instance with at least one event, sorted."""
        with self._translated("list instances"):
            return self._backend.instances()

    @staticmethod
    def _wanted(types: Collection[str]) -> frozenset[str] | None:
        """The type names to keep (``None``: all), each checked to exist."""
        if not types:
            return None
        for name in types:
            if name not in EVENT_TYPES:
                raise StoreConfigError(f"unknown event type {name!r}; known: {sorted(EVENT_TYPES)}")
        return frozenset(types)

    def _meta(self, key: str) -> str | None:
        """A value of the store's meta table (None: not set)."""
        with self._translated("read the meta table"):
            return self._backend.read_meta(key)

    def _set_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        """Set a meta value if it is not set yet (``replace``: always)."""
        with self._translated("write the meta table"):
            self._backend.write_meta(key, value, replace=replace)

    @property
    def _where(self) -> str:
        """The store, as error messages name it."""
        return self._backend.where

    def classify_error(self, error: BaseException) -> type[StoreError] | None:
        """The ``StoreError`` class a foreign (driver or eventsourcing) error becomes at this
        store's edge, or None when ``error`` is not one (steplog's own errors included).

        The one rule for programs that share the store's database (materialized views): a
        ``StoreDamagedError`` means the database is damaged (waiting will not help); a
        ``StoreBusyError``, contention that outlasted the waits or a lost connection (retrying
        may help); another ``StoreUnavailableError``, a database that cannot be used as asked
        (not writable, read-only, a full disk); any other class, a statement that failed."""
        found = self._backend.classify_error(error)
        return None if found is None else found[0]

    @contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        """Run backend calls, turning any driver or eventsourcing error into a ``StoreError``."""
        if self._closed:
            raise StoreUnavailableError(f"cannot {action}: the store {self.url} is closed")
        with self._backend.translated(action):
            yield

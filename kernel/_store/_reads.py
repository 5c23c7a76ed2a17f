"""The store's reads: one stream (``read``, ``read_ranges``, ``find_events``) and the global log
(``read_all``, ``iter_all``, ``follow``), every row checked as it is decoded."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Collection, Iterator, Sequence

from kernel._base._errors import (
    StoreConfigError,
    StoreError,
)
from kernel._base._ids import check_id
from kernel._codec._chain import (
    link_problem,
)
from kernel._codec._hashing import RowLink
from kernel._codec._rows import row_count
from kernel._log._events import EventBase
from kernel._store._core import (
    ROWS_PER_READ,
    StoreCore,
)
from kernel._store._records import (
    ROW_SHIFT,
    Recorded,
)
from kernel._store._scan import ROWS_PER_LOOK, Scan, bulk, codes_pattern, row_may_hold

__all__ = ["SNAPSHOT_KEY", "StoreReads"]

SNAPSHOT_KEY = "snapshot:"
"""The meta key of an instance's snapshot is this followed by its id."""


class StoreReads(StoreCore):
    """The part of ``EventStore`` that reads events back, checking each row against its hashes,
    the chain and the store's integrity mark."""

    def read(
        self,
        instance_id: str,
        *,
        after: int = 0,
        upto: int | None = None,
        limit: int | None = None,
        types: Collection[str] = (),
    ) -> list[EventBase]:
        """The events of ``instance_id`` with ``after < position <= upto``, in stream order.

        ``limit`` keeps the first ``limit`` positions of that window; ``types`` then keeps only
        events of those ``type`` strings (the others are never built). Stream positions are
        contiguous, so page a filtered read by position windows (``after=k, upto=k + n``).
        """
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        if limit is not None:
            if limit < 1:
                return []
            upto = after + limit if upto is None else min(upto, after + limit)
        with self._translated(f"read {instance_id!r}"), bulk():
            rows = self._backend.select_stream(
                instance_id, after=after or None, upto=upto, limit=limit
            )
            if not rows:
                return []
            events, _ = self._decode_run(instance_id, rows, after, upto, wanted)
            return events

    def _decode_run(
        self,
        instance_id: str,
        rows: Sequence[tuple[int, str, bytes]],
        after: int,
        upto: int | None,
        wanted: Collection[str] | None,
    ) -> tuple[list[EventBase], list[RowLink]]:
        """The events in ``(after, upto]`` of consecutive ``rows`` of ``instance_id``, each row
        checked against its hashes and the store's ``IntegrityMark``, and the rows checked to
        link up (from the stream's start when ``after`` is 0); with the rows' links."""
        decode = self._mapper.decode_row
        events: list[EventBase] = []
        links: list[RowLink] = []
        for last, topic, state in rows:
            events += decode(
                instance_id, last, topic, state, after=after, upto=upto, types=wanted, links=links
            )
            self._check_form(instance_id, links[-1], state)
        self._check_links(instance_id, links, from_start=not after)
        return events, links

    def read_after_head(
        self, instance_id: str, position: int, head: bytes
    ) -> list[EventBase] | None:
        """The events of ``instance_id`` after ``position`` (``read(after=position)``), if a row
        of the log ends at ``position`` with the chain hash ``head`` (each later row checked to
        link up with it and with each other); None if none does (the log is shorter, or the
        hash there is another). How a snapshot folded to ``position`` is checked against the
        chain before its tail is folded on top of it."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        if position < 1:
            return None
        with self._translated(f"read {instance_id!r}"), bulk():
            rows = self._backend.select_stream(instance_id, after=position - 1)
            if not rows or rows[0][0] != position:
                return None
            events, links = self._decode_run(instance_id, rows, position, None, None)
            if links[0].head != head:
                return None
            return events

    def read_snapshot(self, instance_id: str) -> str | None:
        """The snapshot text kept for ``instance_id`` (``kernel._run._snapshot``), if any: a
        cache beside the log, in the store's meta table. None also when the store has no meta
        table to read (a reader never creates one), and in a store opened with
        ``allow_broken_chain``, which answers from the log alone."""
        if self.reads_broken_chains:
            return None
        try:
            return self._meta(SNAPSHOT_KEY + instance_id) or None  # "": dropped
        except StoreError:
            return None

    def drop_snapshots(self) -> int:
        """Forget every instance's snapshot (each is replaced by an empty value, read as none);
        how many there were. ``rekey`` does, so that no snapshot stays sealed with an old key,
        or plain in a store now encrypted."""
        dropped = 0
        for instance_id in self._backend.instances():
            if self.read_snapshot(instance_id) is not None:
                self._set_meta(SNAPSHOT_KEY + instance_id, "", replace=True)
                dropped += 1
        return dropped

    def write_snapshot(self, instance_id: str, text: str) -> None:
        """Keep ``text`` as ``instance_id``'s snapshot, replacing the one kept before."""
        self._set_meta(SNAPSHOT_KEY + instance_id, text, replace=True)

    def read_ranges(
        self,
        instance_id: str,
        ranges: Sequence[tuple[int, int]],
        *,
        types: Collection[str] = (),
    ) -> list[EventBase]:
        """The events of ``instance_id`` in each window ``(after, upto]`` of ``ranges`` (in order,
        not overlapping), in stream order: ``read`` of many short windows in one query, for
        readers that know where the events they need are (a key index).

        Each event is checked against its hash, as ``read`` checks it, and so is the chain around
        each window: its rows link up with each other, its first row with the row before it
        (or begins the stream), and its last row with the row after it, read in one more query
        for all the windows. A row forged between rows it does not link up with is refused
        (``LogIntegrityError``), as a ``read`` of the whole stream would refuse it."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        windows = sorted(ranges)
        for (_, upto), (after, _) in itertools.pairwise(windows):
            if after < upto:
                raise StoreConfigError(f"read_ranges: windows overlap at position {after}")
        with self._translated(f"read {instance_id!r}"), bulk():
            events: list[EventBase] = []
            read: list[list[RowLink]] = []
            for (after, upto), rows in zip(
                windows, self._backend.select_windows(instance_id, windows), strict=True
            ):
                found, links = self._decode_run(instance_id, rows, after, upto, wanted)
                events += found
                read.append(links)
            self._check_around(instance_id, [links for links in read if links])
            return events

    def _check_around(self, instance_id: str, windows: Sequence[Sequence[RowLink]]) -> None:
        """Check that each run of rows in ``windows`` links up with the row before it (unless it
        begins the stream) and the row after it (if there is one), read in one query."""
        around: list[tuple[int, int]] = []
        for links in windows:
            if links[0].first > 1:
                around.append((links[0].first - 2, links[0].first - 1))
            around.append((links[-1].last, links[-1].last + 1))
        neighbours = self._backend.select_windows(instance_id, around)
        n = 0
        for links in windows:
            pairs: list[tuple[RowLink, RowLink]] = []
            first = links[0].first
            if first > 1:
                found = [row for row in neighbours[n] if row[0] < first]
                n += 1
                if not found:  # no row ends before it: those positions were deleted
                    before = RowLink(0, 0, None, None)
                else:
                    before = self._mapper.row_link(instance_id, *found[-1])
                pairs.append((before, links[0]))
            found = neighbours[n]
            n += 1
            if found:
                pairs.append((links[-1], self._mapper.row_link(instance_id, *found[-1])))
            for earlier, row in pairs:
                problem = link_problem(instance_id, earlier, row)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())

    def find_events(
        self,
        instance_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        upto: int | None = None,
    ) -> list[EventBase]:
        """The events of ``instance_id`` of ``types`` with ``after < position <= upto``, in
        stream order: what ``read(..., types=types)`` returns, found by looking at each row's
        bytes first. For rare types (run starts, forks) in a long log: only the rows that may
        hold one are decoded.

        A batch row names each of its events' types by a code opening a JSON array
        (``[code, ...``): a row whose JSON (opened first, if sealed) has no array opening with
        the code of a wanted type holds none, and is skipped undecoded (``row_may_hold``). The
        rows that may hold one are decoded as ``read`` decodes them, each event built checked
        against its hash; the rows skipped are not checked, nor are the links between the rows
        decoded (they are not consecutive): a read of the whole log checks those.
        """
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        wanted = self._wanted(types)
        if wanted is None:
            raise StoreConfigError("find_events needs at least one event type")
        needle = codes_pattern(wanted)
        keyring = self._mapper.keyring
        events: list[EventBase] = []
        with self._translated(f"read {instance_id!r}"), bulk():
            decode = self._mapper.decode_row
            start = after
            while True:
                rows = self._backend.select_stream(
                    instance_id, after=start or None, upto=upto, limit=ROWS_PER_LOOK
                )
                for last, topic, state in rows:
                    if row_may_hold(instance_id, last, topic, state, wanted, needle, keyring):
                        links: list[RowLink] = []
                        events += decode(
                            instance_id,
                            last,
                            topic,
                            state,
                            after=after,
                            upto=upto,
                            types=wanted,
                            links=links,
                        )
                        self._check_form(instance_id, links[0], state)
                if len(rows) < ROWS_PER_LOOK or (upto is not None and rows[-1][0] >= upto):
                    return events
                start = rows[-1][0]

    def read_all(
        self,
        *,
        after: int = 0,
        limit: int = 500,
        upto: int | None = None,
        types: Collection[str] = (),
    ) -> list[Recorded]:
        """One page of events of every stream in global order, with ``global_position > after``.

        ``types`` keeps only events of those ``type`` strings (the others are never built). A
        page holds ``limit`` events unless the log has no more up to ``upto``: a short page means
        the reader has seen everything so far.

        Each event is checked against its hash; a scan (a read from the start, or one that goes
        on where this store's previous page ended, as a projector's catch-up and ``iter_all``
        do) also checks that each instance's rows link up, as ``read`` does.
        """
        if limit < 1:
            raise StoreConfigError(f"limit must be >= 1, got {limit}")
        wanted = self._wanted(types)
        upto_row = None if upto is None else upto >> ROW_SHIFT
        page: list[Recorded] = []
        after_row = (after >> ROW_SHIFT) - 1 if after else 0
        scan, self._scan = self._scan, None  # taken: a concurrent reader starts its own
        if scan is None or scan.end != after:
            scan = Scan(after, {}, from_start=not after)
        try:
            with self._translated("read the global log"), bulk():
                while len(page) < limit:
                    # Rows are read a few at a time (a row usually holds a whole superstep, so a
                    # page needs far fewer rows than events); a short read means no more.
                    wanted_rows = min(limit - len(page), ROWS_PER_READ)
                    rows = self._backend.select_rows(
                        after=after_row, limit=wanted_rows, upto=upto_row
                    )
                    for row_id, instance_id, last, topic, state in rows:
                        self._page_row(
                            page, row_id, instance_id, last, topic, state, after, upto, wanted, scan
                        )
                        if len(page) >= limit:
                            del page[limit:]
                            return page
                    if len(rows) < wanted_rows:
                        return page
                    after_row = rows[-1][0]
            return page
        finally:
            if page:
                scan.end = page[-1].global_position
            self._scan = scan

    def _page_row(
        self,
        page: list[Recorded],
        row_id: int,
        instance_id: str,
        last: int,
        topic: str,
        state: bytes,
        after: int,
        upto: int | None,
        wanted: frozenset[str] | None,
        scan: Scan,
    ) -> None:
        """Add the events of one row that fall in ``(after, upto]`` (global) to ``page``; check
        that a row entered from its start links up with the instance's row before it."""
        base = row_id << ROW_SHIFT
        count = row_count(instance_id, last, topic)
        first = last - count + 1
        low = first + max(after - base + 1, 0) - 1  # positions up to ``low`` are already read
        high = last if upto is None else min(last, first + upto - base)
        if low >= high:
            return
        links: list[RowLink] = []
        for event in self._mapper.decode_row(
            instance_id, last, topic, state, after=low, upto=high, types=wanted, links=links
        ):
            page.append(Recorded(base + event.position - first, event))
        self._check_form(instance_id, links[0], state, row_id)
        if low < first and row_id > scan.entered:  # entered from its start, for the first time
            scan.entered = row_id
            link = links[0]
            before = scan.links.get(instance_id)
            if before is not None or scan.from_start:
                problem = link_problem(instance_id, before, link)
                if problem is not None:
                    if self._mapper.on_broken is None:
                        raise problem.error()
                    self._mapper.on_broken(problem.error())
            scan.links[instance_id] = link

    def _last_row(self) -> tuple[int, str, int, str] | None:
        """``(row id, instance id, last position, topic)`` of the newest row a reader may pass."""
        last = self._backend.last_row_id()
        if not last:
            return None
        rows = self._backend.select_rows(after=last - 1, limit=1, upto=last)
        return None if not rows else rows[0][:4]

    def iter_all(
        self, *, after: int = 0, page_size: int = 500, types: Collection[str] = ()
    ) -> Iterator[Recorded]:
        """Every event after ``after`` in global order (only ``types``, if given), page by page."""
        position = after
        while True:
            page = self.read_all(after=position, limit=page_size, types=types)
            yield from page
            if len(page) < page_size:
                return
            position = page[-1].global_position

    def last_position(self) -> int:
        """The global position of the newest event, 0 for an empty store."""
        with self._translated("read the global log"):
            last = self._last_row()
        if last is None:
            return 0
        row_id, instance_id, position, topic = last
        return (row_id << ROW_SHIFT) + row_count(instance_id, position, topic) - 1

    def follow(
        self,
        *,
        after: int = 0,
        stop: threading.Event | None = None,
        poll_interval: float = 0.2,
        page_size: int = 500,
    ) -> Iterator[Recorded]:
        """Every event after ``after``, then each new one as it is appended, until ``stop`` is set.

        Backends that can push (memory, PostgreSQL's LISTEN/NOTIFY) wake at once; SQLite polls
        every ``poll_interval`` seconds.
        """
        stop = stop or threading.Event()
        position = after
        while not stop.is_set():
            page = self.read_all(after=position, limit=page_size)
            for recorded in page:
                yield recorded
                position = recorded.global_position
                if stop.is_set():
                    return
            if len(page) < page_size:
                self._backend.wait_for_appends(
                    newer=functools.partial(self._moved_past, position),
                    timeout=poll_interval,
                    stop=stop,
                )

    def _moved_past(self, position: int) -> bool:
        """Whether the log holds an event after global ``position``."""
        return self.last_position() > position

"""Checking the hash chain of a whole log (``verify_chain``) and reading its heads."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernel._base._errors import (
    DecodeError,
    LogIntegrityError,
    MissingKeyError,
    StoreConfigError,
)
from kernel._base._ids import check_id
from kernel._codec._chain import (
    ChainHead,
    ChainProblem,
    ChainReport,
    link_problem,
    tail_problem,
)
from kernel._codec._hashing import RowLink
from kernel._store._core import (
    ROWS_PER_READ,
    StoreCore,
)

__all__ = ["ChainChecks"]


class ChainChecks(StoreCore):
    """The part of ``EventStore`` that checks and exports the hash chain."""

    def chain_head(self, instance_id: str) -> ChainHead | None:
        """The instance's recorded chain head (None: none recorded), to export: held elsewhere,
        it lets ``verify_chain(heads=...)`` prove later that nothing up to it changed."""
        with self._translated(f"read the chain head of {instance_id!r}"):
            found = self._backend.select_heads(instance_id).get(instance_id)
        return None if found is None else ChainHead(instance_id, found[0], found[1].hex())

    def event_hash(self, instance_id: str, position: int) -> bytes | None:
        """The chain's hash of the event of ``instance_id`` at ``position``, as its row holds it
        (opened with the store's keys if sealed): what a materialized view records to say which
        log it was folded from. None when there is no event there, or its row was written
        before the hash chain. Reads one row; checks nothing else."""
        check_id(instance_id, "instance id", StoreConfigError, limit=None)
        if position < 1:
            return None
        with self._translated(f"read {instance_id!r}#{position}"):
            rows = self._backend.select_stream(
                instance_id, after=position - 1, upto=position, limit=1
            )
            if not rows or rows[0][0] < position:
                return None
            last, topic, state = rows[0]
            return self._mapper.event_hash(instance_id, last, topic, state, position)

    def verify_chain(
        self,
        instance_id: str | None = None,
        *,
        heads: Sequence[ChainHead] = (),
        progress: Callable[[int], None] | None = None,
    ) -> ChainReport:
        """Check the hash chain of one instance (or of every one): every event against its
        hash, every row against the one before it, the end of the log against the recorded
        head, and each of ``heads`` (exported earlier) against the event at its position.

        Returns a ``ChainReport`` listing every problem with its position and kind; raises only
        when the store cannot be read: a ``StoreError``, or ``MissingKeyError`` for a sealed row
        whose key this store was not given (no keys, or wrong ones), since what cannot be opened
        cannot be checked, and is not evidence of tampering either. ``progress`` is called with
        the number of events checked after each batch of rows."""
        report = ChainReport()
        if self._mark_problem is not None:
            report.problems.append(self._mark_problem)
        with self._translated("verify the hash chain"):
            recorded = self._backend.select_heads(instance_id)
            wanted: dict[str, list[ChainHead]] = {}
            for head in heads:
                if instance_id is None or head.instance_id == instance_id:
                    wanted.setdefault(head.instance_id, []).append(head)
            names = [instance_id] if instance_id is not None else self.instances()
            if instance_id is None:  # instances whose rows are all gone: heads still name them
                names += sorted((set(recorded) | set(wanted)) - set(names))
            for name in names:
                self._verify_instance(name, wanted.get(name, []), report, progress)
        return report

    def _decode_every_event(
        self,
        instance_id: str,
        last: int,
        topic: str,
        state: bytes,
        links: list[RowLink],
        problems: list[LogIntegrityError],
    ) -> ChainProblem | None:
        """Decode every event of a row as a reader would (checking each against its hash), so
        that verify names what any reader would refuse. A row that is whole and links up, but
        holds an event that does not fit its schema, is a ``malformed`` problem returned here
        (its other events' hashes still checked, its link still followed); a row that cannot be
        read at all raises, as before."""
        try:
            self._mapper.decode_row(
                instance_id,
                last,
                topic,
                state,
                links=links,
                on_broken=problems.append,
                check_all=True,
            )
            return None
        except MissingKeyError:
            raise
        except DecodeError as error:
            if not links:  # the row itself is unreadable: the caller's rule
                raise
            self._mapper.decode_row(  # the rest of its hashes, no event built
                instance_id,
                last,
                topic,
                state,
                types=(),
                on_broken=problems.append,
                check_all=True,
            )
            return ChainProblem(instance_id, links[0].first, "malformed", str(error))

    def _verify_instance(
        self,
        instance_id: str,
        heads: list[ChainHead],
        report: ChainReport,
        progress: Callable[[int], None] | None,
    ) -> None:
        report.instances += 1
        problems: list[LogIntegrityError] = []
        before: RowLink | None = None
        lost = False  # the row before could not be read: nothing to link the next one to
        after = 0
        by_position = {head.position: head for head in heads}
        while True:
            rows = self._backend.select_stream(
                instance_id, after=after or None, upto=None, limit=ROWS_PER_READ
            )
            for last, topic, state in rows:
                after = last
                links: list[RowLink] = []
                try:
                    unfit = self._decode_every_event(
                        instance_id, last, topic, state, links, problems
                    )
                    if unfit is not None:
                        report.problems.append(unfit)
                except MissingKeyError:
                    raise  # a row this keyring cannot open cannot be checked: not a broken chain
                except (LogIntegrityError, DecodeError) as error:
                    where = before.last + 1 if before is not None else 1
                    if isinstance(error, LogIntegrityError):
                        report.problems.append(ChainProblem.of(error, instance_id, where))
                    else:
                        report.problems.append(
                            ChainProblem(instance_id, where, "malformed", str(error))
                        )
                    before, lost = None, True
                    continue
                link = links[0]
                report.rows += 1
                count = link.last - link.first + 1
                report.events += count
                if link.head is None:
                    report.unchained_events += count
                report.problems += [ChainProblem.of(e, instance_id, link.first) for e in problems]
                problems.clear()
                form = self._form_problem(instance_id, link, state)
                if form is not None:
                    report.problems.append(form)
                problem = None if lost else link_problem(instance_id, before, link)
                if problem is not None and (form is None or form.kind != problem.kind):
                    report.problems.append(problem)
                for position in [p for p in by_position if link.first <= p <= link.last]:
                    head = by_position.pop(position)
                    self._check_exported(instance_id, head, link, state, topic, report)
                before, lost = link, False
            if progress is not None:
                progress(report.events)
            if len(rows) == ROWS_PER_READ:
                continue
            # The log is read to its end; its head is read after it, so that a writer appending
            # meanwhile (a row and its head in one transaction) is seen as having written more,
            # read next, never as rows past the head or as a truncated tail.
            recorded = self._backend.select_heads(instance_id).get(instance_id)
            if recorded is None or recorded[0] <= after:
                break
            if not self._backend.select_stream(
                instance_id, after=after or None, upto=None, limit=1
            ):
                break  # the head is past the last row: the tail was removed
        problem = tail_problem(instance_id, before, recorded)
        if problem is not None:
            report.problems.append(problem)
        for head in by_position.values():
            report.problems.append(
                ChainProblem(
                    instance_id,
                    head.position,
                    "truncated",
                    f"the exported head of {instance_id!r} at position {head.position} is past the "
                    "end of its log: events were removed",
                )
            )

    def _check_exported(
        self,
        instance_id: str,
        head: ChainHead,
        link: RowLink,
        state: bytes,
        topic: str,
        report: ChainReport,
    ) -> None:
        """Check an exported head against the hash of the event at its position."""
        found = self._mapper.event_hash(instance_id, link.last, topic, state, head.position)
        if found is None or found.hex() != head.hash:
            report.problems.append(
                ChainProblem(
                    instance_id,
                    head.position,
                    "head mismatch",
                    f"the event of {instance_id!r} at position {head.position} does not end in "
                    "the exported head: something up to it was changed since the head was taken",
                )
            )

"""What an opened store's rows must be: its integrity mark and encryption mark, settled when it is
opened (``TrustedStore``)."""

from __future__ import annotations

from kernel._base._errors import (
    StepLogError,
    StoreConfigError,
)
from kernel._codec._chain import (
    ChainProblem,
    IntegrityMark,
)
from kernel._codec._cipher import KEYS_ENV, Keyring, is_sealed
from kernel._codec._mapper import RowMapper
from kernel._store._core import (
    ENCRYPTION_MARK,
    INTEGRITY_MARK,
    ROWS_PER_READ,
    StoreCore,
)

__all__ = ["TrustedStore"]


class TrustedStore(StoreCore):
    """The part of ``EventStore`` that decides, when the store is opened, what its rows must be
    (``IntegrityMark``: chained from which row, sealed unless written before the key), records
    it, and marks a store encrypted (``rekey``)."""

    def _configure(
        self, *, keyring: Keyring | None, allow_broken_chain: bool, create: bool
    ) -> None:
        """Apply ``open_store``'s trust options: the keyring that seals and opens rows, whether
        a broken chain is read (and noted in ``chain_problems``) rather than refused, and the
        store's encryption mark (set by the first writer with a key; a writer without one is
        refused, so that no plain row follows sealed ones), and its ``IntegrityMark``
        (``_settle_marks``)."""
        self.reads_broken_chains = allow_broken_chain
        self._mapper = RowMapper(  # built whole: the keys and the policy are known only now
            self._mapper.upcasters,
            keyring=keyring,
            on_broken=self._note_broken if allow_broken_chain else None,
        )
        text = self._meta(INTEGRITY_MARK)
        parsed = None if text is None else IntegrityMark.from_text(text)
        mark = None if parsed is None else parsed[0]
        marked = self._meta(ENCRYPTION_MARK) is not None
        # A mark that says sealed (tagged or not), or a sealed newest row, says encrypted too:
        # deleting the meta row ``encryption`` must not turn encryption off.
        marked = marked or (mark is not None and mark.plain is not None)
        if keyring is None and create and (marked or self._newest_row_sealed()):
            raise StoreConfigError(
                f"{self._where} is encrypted: open it with its keys to write to it ({KEYS_ENV}, "
                "or steplog's --keys-file FILE; in Python, open_store(url, "
                "keyring=Keyring.from_text(...)), or create=False to only read what is not sealed)"
            )
        self._encrypted = marked
        self._settle_marks(text, parsed, writes=create and not getattr(self, "read_only", False))

    def _settle_marks(
        self, text: str | None, parsed: tuple[IntegrityMark, str] | None, *, writes: bool
    ) -> None:
        """Decide what this store's rows must be (its ``IntegrityMark``, ``text`` as read from
        the meta table), and record it when this store may write and it is not recorded yet.

        With keys, only a mark tagged with one of them is believed. A store that holds sealed
        rows (or is marked encrypted) without such a mark, a mark that is malformed, or one
        whose tag does not match or names a key not in the keyring raises
        ``LogIntegrityError`` (``mark altered``; with ``allow_broken_chain``, noted, and every
        row must then be chained and sealed). A mark is never computed from the rows of such a
        store (they would vouch for a forged one). A store without sealed rows read with keys
        is plain; its first writer with keys records which rows were written plain (the last
        position of each instance), tags the mark, then marks the store encrypted. Without
        keys, a recorded mark is used as it is (it cannot be checked); without one, the rows
        say from which row on they are chained, and a writer records that."""
        keyring = self._mapper.keyring
        mark, tag = parsed if parsed is not None else (None, "")
        malformed = text is not None and parsed is None
        if keyring is not None:
            if mark is not None and tag and keyring.tag_matches(tag, mark.message()) is True:
                self._marks = mark
                if writes and mark.plain is not None:  # put back a deleted encryption mark
                    self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
                    self._encrypted = True
                return
            encrypted = self._encrypted or self._backend.first_sealed_row() is not None
            if mark is not None and tag and keyring.tag_matches(tag, mark.message()) is None:
                # Tagged with a key not in the keyring: wrong keys, or a forged tag. Reading
                # goes on with every row having to be sealed (rows sealed with that key say
                # which key they need); nothing is written with keys that may be the wrong ones.
                self._encrypted = True
                self._mark_refused(
                    f"it is tagged with key {tag.partition(':')[0][:16]!r}, which is not in the "
                    "keyring (wrong keys, or a tag forged by someone without the key)",
                    now=writes,
                )
                return
            if malformed or tag or encrypted:
                self._encrypted = self._encrypted or encrypted
                self._mark_refused(
                    "its keys wrote none"
                    if text is None
                    else "it is not one its keys wrote (malformed, untagged, or tagged with a "
                    "key not in the keyring)"
                )
                return
            chained = self._computed_marks().chained_from if mark is None else mark.chained_from
            if not writes:
                self._marks = IntegrityMark(chained, None)
                return
            with self._translated("read the global log"):
                plain = self._backend.last_positions()
            # The mark first: a store marked encrypted without its mark would be refused.
            self._record_marks(IntegrityMark(chained, plain))
            self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
            self._encrypted = True
            return
        if malformed:
            self._mark_refused("it is malformed")
        elif mark is not None:
            self._marks = mark
        elif self._encrypted:  # an encrypted store whose mark was removed: every row sealed
            self._marks = IntegrityMark(None, {})
        else:
            self._marks = self._computed_marks()
            if writes:
                self._record_marks(self._marks)

    def _mark_refused(self, why: str, *, now: bool = True) -> None:
        """Refuse (or note, reading every row as having to be chained and sealed) a store whose
        integrity mark cannot be believed, for ``why``. Not ``now``: only noted (``verify``
        names it), every row read as having to be sealed."""
        self._marks = IntegrityMark(0, {} if self._encrypted else None)
        self._mark_problem = ChainProblem(
            "",
            0,
            "mark altered",
            f"the integrity mark of {self._where} (meta key {INTEGRITY_MARK!r}) cannot be "
            f"believed: {why}. Someone without the key may have altered or removed it, to have "
            "plain or unchained rows read as if written before the key or the chain. A store "
            "encrypted by a steplog older than this mark gets it from 'steplog "
            "--allow-broken-chain rekey' with its keys (which refuses every plain row)",
        )
        if now:
            self._refuse(self._mark_problem)

    def _record_marks(self, mark: IntegrityMark) -> None:
        """Write ``mark`` to the meta table (tagged with the current key, if any)."""
        keyring = self._mapper.keyring
        tag = "" if keyring is None else keyring.tag(mark.message())
        self._set_meta(INTEGRITY_MARK, mark.to_text(tag), replace=True)
        self._marks = mark

    def _mark_encrypted(self) -> tuple[IntegrityMark, bool]:
        """Mark the store encrypted, for ``rekey`` (``_rekey``): record the ``IntegrityMark``
        its rows are then checked against (tagged with the current key), then the encryption
        mark. Returns that mark, and whether the store was not marked encrypted before.

        The mark lists the rows written plain (each instance's last position so far) when the
        store gets its first key; when its mark cannot be believed, none (every row must be
        sealed)."""
        marks = self._marks
        if self._mark_problem is not None:
            marks = IntegrityMark(self._computed_marks().chained_from, {})
        elif marks.plain is None:
            with self._translated("read the global log"):
                marks = IntegrityMark(marks.chained_from, self._backend.last_positions())
        newly = self._meta(ENCRYPTION_MARK) is None
        self._record_marks(marks)
        self._set_meta(ENCRYPTION_MARK, "aes-256-gcm")
        self._encrypted = True
        return marks, newly

    def _computed_marks(self) -> IntegrityMark:
        """The ``IntegrityMark`` the rows of a plain store give (``_settle_marks``): one look
        at the log in row order up to its first chained row."""
        keyring = self._mapper.keyring
        with self._translated("read the global log"):
            last = self._backend.newest_row_id()
            chained_at = None
            after = 0
            while chained_at is None:
                rows = self._backend.select_rows(after=after, limit=ROWS_PER_READ, upto=None)
                for row_id, instance_id, position, topic, state in rows:
                    if keyring is None and is_sealed(bytes(state)):
                        chained_at = row_id  # cannot be looked into: its readers will say
                        break
                    try:
                        link = self._mapper.row_link(instance_id, position, topic, state)
                    except StepLogError:
                        continue  # left to its readers to name
                    if link.head is not None:
                        chained_at = row_id
                        break
                if len(rows) < ROWS_PER_READ:
                    break
                after = rows[-1][0]
        return IntegrityMark(last if chained_at is None else chained_at - 1, None)

    def _newest_row_sealed(self) -> bool:
        """Whether the store's newest row is sealed (one row read)."""
        with self._translated("read the newest row"):
            last = self._backend.newest_row_id()
            rows = self._backend.select_rows(after=last - 1, limit=1, upto=None) if last > 0 else []
        return bool(rows) and is_sealed(bytes(rows[0][4]))

    def holds_plain_rows(self) -> bool:
        """Whether this store holds rows in plain text, told cheaply (no scan): an encrypted
        store holds those its integrity mark lists as written before its first key (``rekey``
        seals them, and only them); a store never written with a key holds only plain rows (by
        its first row: an empty store holds none)."""
        if self._marks.plain is not None:  # encrypted: the rows its mark lists as plain
            return bool(self._marks.plain)
        with self._translated("read the first row"):
            first = self._backend.select_rows(after=0, limit=1, upto=None)
        return bool(first) and not is_sealed(bytes(first[0][4]))

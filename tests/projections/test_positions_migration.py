"""Views tracked before batch rows go on exactly where they stopped: their positions (row ids of
one-event rows) are carried over to global positions once, and nothing is folded twice."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from kernel import open_store
from kernel._store._records import ROW_SHIFT
from kernel.testing import LogBuilder
from projections import HistoryView, Projector, history_of
from projections._views import _sqlbackends

DATA = Path(__file__).parent.parent / "data"


def test_positions_tracked_in_row_ids_are_carried_over_once(tmp_path: Path) -> None:
    assert _sqlbackends.ROW_SHIFT == ROW_SHIFT  # the views' copy of the kernel's row format
    path = tmp_path / "format1.db"
    shutil.copyfile(DATA / "format1.db", path)
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        projector = Projector(store, ["state", "history"])
        projector.catch_up()
        tracked = projector.position("history")
        assert tracked == store.last_position()
    # As the previous steplog left it: positions are row ids, and there is no marker row.
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM steplog_view_positions WHERE name = '#positions'")
        db.execute(f"UPDATE steplog_view_positions SET position = position >> {ROW_SHIFT}")
        (old,) = db.execute(
            "SELECT position FROM steplog_view_positions WHERE name = ?", (HistoryView().table,)
        ).fetchone()
    assert old == tracked >> ROW_SHIFT
    with open_store(url) as store:
        log = LogBuilder("counting", version=store.version("counting"))
        log.start_run()
        log.start_superstep()
        log.invoke("counter")
        log.write("count", 99)
        log.commit()
        log.complete_run()
        log.append_to(store)
        projector = Projector(store, ["state", "history"])
        assert projector.position("history") == tracked  # carried over
        folded = projector.catch_up()
        assert len(log.events()) <= folded <= 2 * len(log.events())  # only the new row
        assert projector.state("counting") == {"count": 99}
        assert projector.history("counting").runs() == history_of(store, "counting").runs()
        again = Projector(store, ["state", "history"])
        assert again.position("history") == store.last_position()  # shifted once, not twice
        assert all(projector.verify(name).ok for name in ("state", "history"))

"""The UI's web application: Starlette routes rendering Jinja2 templates (autoescaped).

Every page asks ``Reader`` (``_data``), which asks the projections. Nothing here writes to the
store. ``create_app(store, token=...)`` builds the application; ``serve`` runs it (``_serve``).
"""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kernel import DecodeError, EventStore, LogIntegrityError, MissingKeyError
from projections import RunRecord, SuperstepRecord
from projections._folds._runrecords import STATUS_TEXT, closer_label, status_text
from projections._frontend._render import broken_chain_text, read_error_text, show_value
from projections._frontend._steps import (
    arguments_text,
    duration_text,
    result_parts,
    result_text,
    usage_parts,
)
from projections._views._manifest import VIEW_MISMATCH
from projections.ui._data import NotFound, Reader
from projections.ui._graph import graph_of
from projections.ui._guard import LOOPBACK_HOSTS, HostGuard

__all__ = ["BROKEN_STATUS", "PAGE_SIZE", "TOKEN_COOKIE", "UNREADABLE_STATUS", "create_app"]

PAGE_SIZE = 50
"""Rows per page of the run list and of a timeline."""
TOKEN_COOKIE = "steplog_ui_token"
BROKEN_STATUS = 409
"""The status of a page that met a broken chain (``LogIntegrityError``): the log conflicts with
its own hash chain, so no page is served from it; the error page names where."""
UNREADABLE_STATUS = 403
"""The status of a page that met a row it cannot read (``DecodeError``): above all a sealed row
whose key the server was not given (``MissingKeyError``). The error page says so in the CLI's
words (``read_error_text``): which key, and how to give it."""
POLL_SECONDS = 0.5
"""How often a live page's event stream asks the store for the instance's version."""
_HERE = Path(__file__).parent


def _json(value: Any, limit: int = 400) -> str:
    return show_value(value, limit=limit)


def _time(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _utc_local(moment: datetime) -> str:
    """A time as an ``<input type=datetime-local>`` value, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"), autoescape=True, auto_reload=False
    )
    env.filters["json"] = _json
    env.filters["time"] = _time
    env.filters["status"] = status_text
    env.filters["utc_local"] = _utc_local
    env.filters["short"] = lambda text, n=10: text if len(text) <= n else text[:n]
    env.filters["closer"] = lambda text: closer_label(text, 10)
    env.filters["duration"] = duration_text
    env.filters["usage"] = usage_parts
    env.filters["arguments"] = arguments_text
    env.filters["result_parts"] = result_parts
    env.filters["text"] = result_text
    return env


class _Pages:
    """The pages. They are plain functions, which Starlette runs in its thread pool, so that a
    long first fold of a big instance never blocks the event loop (nor the live streams)."""

    def __init__(self, reader: Reader, token: str | None) -> None:
        self.reader = reader
        self.token = token
        self.env = _environment()

    def render(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        page = self.env.get_template(name).render(request=request, url=_url, **values)
        return HTMLResponse(page, status_code=status)

    # -- the run list -----------------------------------------------------------------------

    def runs(self, request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        page = _int(request.query_params.get("page"), 1)
        rows: list[tuple[str, RunRecord]] = []
        for instance in self.reader.instances():
            for run in self.reader.history(instance).runs():
                if not query or _matches(query, instance, run):
                    rows.append((instance, run))
        pages = _page_in(page, max(1, math.ceil(len(rows) / PAGE_SIZE)))
        shown = rows[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        return self.render(
            request,
            "runs.html",
            rows=shown,
            total=len(rows),
            query=query,
            page=page,
            pages=pages,
            live=_url("/live"),
            version=self.reader.store.last_position(),
        )

    # -- a run's timeline ---------------------------------------------------------------------

    def instance(self, request: Request) -> Response:
        instance = self.reader.instance(request.path_params["instance"])
        history = self.reader.history(instance)
        run_id = request.query_params.get("run")
        if run_id is not None and history.run(run_id) is None:
            raise NotFound(f"no run {run_id!r} in instance {instance!r}")
        page = _int(request.query_params.get("page"), 1)
        shown, total = self.reader.page(instance, run_id, page, PAGE_SIZE)
        pages = _page_in(page, max(1, math.ceil(total / PAGE_SIZE)))
        selected_id = request.query_params.get("step")
        selected = history.superstep(selected_id) if selected_id else None
        if selected_id and selected is None:
            raise NotFound(f"no superstep {selected_id!r} in instance {instance!r}")
        details = self.reader.step_details(instance, shown)
        links = self.reader.subworkflows(instance)
        return self.render(
            request,
            "instance.html",
            instance=instance,
            history=history,
            run_id=run_id,
            steps=shown,
            details=details,
            page=page,
            pages=pages,
            total=total,
            selected=selected,
            graph=_graph_url(instance, selected.executors if selected else ()),
            subworkflows=links,
            parent=self.reader.parent(instance),
            answered=self.reader.answered(instance),
            live=_url(f"/i/{instance}/live"),
            version=self.reader.version(instance),
        )

    # -- state at a point ---------------------------------------------------------------------

    def state(self, request: Request) -> Response:
        instance = self.reader.instance(request.path_params["instance"])
        text, at = self.reader.point(instance, request.query_params.get("at"))
        history = self.reader.history(instance)
        step = history.superstep(at.superstep_id) if at.superstep_id else None
        neighbours: tuple[SuperstepRecord | None, SuperstepRecord | None] = (None, None)
        if step is not None:
            neighbours = self.reader.neighbours(instance, step.superstep_id)
        moment = self.reader.moment(instance, at.position)
        return self.render(
            request,
            "state.html",
            moment=moment,
            instance=instance,
            text=text,
            at=at,
            step=step,
            previous=neighbours[0],
            following=neighbours[1],
            values=sorted(at.values.items()),
            version=self.reader.version(instance),
            graph=_graph_url(instance, step.executors if step else ()),
            live=_url(f"/i/{instance}/live"),
        )

    # -- the graph -----------------------------------------------------------------------------

    def graph(self, request: Request) -> Response:
        """The instance's graph as an SVG fragment (``?active=`` executors highlighted): the one
        answer that scans the log (kept and continued per server), fetched by the pages after
        they are shown."""
        instance = self.reader.instance(request.path_params["instance"])
        first_ran, routes = self.reader.graph(instance)
        active = request.query_params.getlist("active")
        return HTMLResponse(str(graph_of(first_ran, routes).svg(active)))

    # -- diff and blame ----------------------------------------------------------------------

    def diff(self, request: Request) -> Response:
        instance = self.reader.instance(request.path_params["instance"])
        before = request.query_params.get("a") or "pos:0"
        after = request.query_params.get("b") or f"pos:{self.reader.version(instance)}"
        changes = self.reader.diff(instance, before, after)
        return self.render(
            request,
            "diff.html",
            instance=instance,
            before=before,
            after=after,
            added=sorted(changes.added.items()),
            removed=sorted(changes.removed.items()),
            changed=sorted(changes.changed.items()),
        )

    def blame(self, request: Request) -> Response:
        instance = self.reader.instance(request.path_params["instance"])
        key = request.path_params["key"]
        blame = self.reader.blame(instance, key)
        current = blame.current(key)
        return self.render(
            request,
            "blame.html",
            instance=instance,
            key=key,
            writes=blame.writes(key),
            current=current,
            live=_url(f"/i/{instance}/live"),
            version=self.reader.version(instance),
        )

    # -- live ----------------------------------------------------------------------------------

    async def live_instance(self, request: Request) -> Response:
        instance = self.reader.instance(request.path_params["instance"])

        def check() -> None:
            self.reader.history(instance)

        await asyncio.to_thread(check)  # a broken chain: the error page, not a stream
        return self._stream(request, lambda: self.reader.version(instance), check)

    async def live_all(self, request: Request) -> Response:
        def check() -> None:
            for instance in self.reader.instances():
                self.reader.history(instance)

        await asyncio.to_thread(check)
        return self._stream(request, self.reader.store.last_position, check)

    def _stream(
        self, request: Request, version: Callable[[], int], check: Callable[[], None]
    ) -> Response:
        """Server-sent events: the ``version`` each time it changes, once ``check`` (what the
        page reads) passed; a broken chain found meanwhile is sent as a ``broken`` event with the
        error's text, and ends the stream; a row it cannot read (a sealed one without its key),
        as an ``unreadable`` event the same way."""

        async def events() -> AsyncIterator[bytes]:
            last = -1
            quiet = 0.0
            while not await request.is_disconnected():
                now = await asyncio.to_thread(version)
                if now != last:
                    try:
                        await asyncio.to_thread(check)
                    except (LogIntegrityError, DecodeError) as error:
                        text = " ".join(_error_text(error).split())
                        kind = "broken" if isinstance(error, LogIntegrityError) else "unreadable"
                        yield f"event: {kind}\ndata: {text}\n\n".encode()
                        return
                    last = now
                    quiet = 0.0
                    yield f"data: {now}\n\n".encode()
                elif quiet >= 15:
                    quiet = 0.0
                    yield b": still here\n\n"
                await asyncio.sleep(POLL_SECONDS)
                quiet += POLL_SECONDS

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # -- errors --------------------------------------------------------------------------------

    async def broken(self, request: Request, error: Exception) -> Response:
        """A page that met a broken chain (``LogIntegrityError``, or any of its subclasses):
        status 409, and the CLI's words naming the first bad place (``broken_chain_text``)."""
        assert isinstance(error, LogIntegrityError)
        return self.render(
            request,
            "error.html",
            BROKEN_STATUS,
            title="a view does not match the log"
            if error.kind == VIEW_MISMATCH
            else "the log was altered",
            detail=broken_chain_text(error),
            integrity=error,
        )

    async def unreadable(self, request: Request, error: Exception) -> Response:
        """A page that met a row it cannot read (``DecodeError``; above all ``MissingKeyError``,
        a sealed row whose key was not given): ``UNREADABLE_STATUS``, and the CLI's words
        (``read_error_text``). Never a claim that the log was altered."""
        assert isinstance(error, DecodeError)
        return self.render(
            request,
            "error.html",
            UNREADABLE_STATUS,
            title="encrypted: its key was not given"
            if isinstance(error, MissingKeyError)
            else "a row cannot be read",
            detail=read_error_text(error),
        )

    async def not_found(self, request: Request, error: Exception) -> Response:
        detail = str(error) if isinstance(error, NotFound) else "no such page"
        if isinstance(error, HTTPException) and error.status_code != 404:
            return self.render(
                request, "error.html", error.status_code, title="error", detail=error.detail
            )
        return self.render(request, "error.html", 404, title="not found", detail=detail)


def _error_text(error: LogIntegrityError | DecodeError) -> str:
    """The CLI's one line for an error a page met reading the log."""
    if isinstance(error, LogIntegrityError):
        return broken_chain_text(error)
    return read_error_text(error)


def _int(text: str | None, default: int) -> int:
    """A page number: ``default`` when none is given; ``NotFound`` for anything but a whole
    number from 1 (never read as another page)."""
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise NotFound(f"no page {text!r}: a page is a whole number from 1")
    return int(text)


def _page_in(page: int, pages: int) -> int:
    """``pages`` when ``page`` is one of them; ``NotFound`` otherwise (never moved to the last)."""
    if page > pages:
        raise NotFound(f"no page {page}: there {'is' if pages == 1 else 'are'} {pages}")
    return pages


def _matches(query: str, instance: str, run: RunRecord) -> bool:
    error = f"{run.error.type} {run.error.message}" if run.error else ""
    hay = " ".join(
        (
            instance,
            run.run_id,
            run.workflow_name,
            run.status,
            STATUS_TEXT.get(run.status, ""),
            error,
        )
    )
    return query.lower() in hay.lower()


def _graph_url(instance: str, active: Iterable[str]) -> str:
    """Where a page fetches the instance's graph from, ``active`` executors highlighted."""
    query = urlencode([("active", name) for name in active])
    return f"/i/{quote(instance)}/graph" + ("?" + query if query else "")


def _url(path: str, **query: Any) -> str:
    """``path`` with the query parameters that are not None."""
    kept = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(kept) if kept else "")


class _TokenCheck(BaseHTTPMiddleware):
    """With a token: every request carries it (``?token=`` once, then the cookie it sets)."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        given = request.query_params.get("token")
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            response = await call_next(request)
            response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
            return response
        if hmac.compare_digest(cookie.encode(), self.token.encode()):
            return await call_next(request)
        return HTMLResponse(
            "<!doctype html><title>steplog ui: token needed</title><h1>403: token needed</h1>"
            "<p>This server was started with an access token: open the address it printed "
            "(<code>?token=...</code>).</p>",
            status_code=403,
        )


def create_app(
    store: EventStore,
    *,
    token: str | None = None,
    reveal: bool = False,
    sensitive: tuple[str, ...] = (),
    allow_broken_chain: bool = False,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
    any_ip_host: bool = False,
) -> Starlette:
    """The UI over ``store`` (read only). ``token``: every request must carry it; ``reveal``
    shows sensitive values, ``sensitive`` redacts more keys (as the CLI's options). A page that
    meets a broken chain answers ``BROKEN_STATUS`` with the error, unless ``allow_broken_chain``
    (the store itself opened with it reads such a log anyway).

    Only requests whose ``Host`` is one of ``allowed_hosts`` (or, with ``any_ip_host``, an IP
    address) are answered, others get a 400; every answer carries ``SECURITY_HEADERS``
    (``projections.ui._guard``: a strict Content-Security-Policy, no framing, no sniffing)."""
    reader = Reader(
        store, reveal=reveal, sensitive=sensitive, allow_broken_chain=allow_broken_chain
    )
    pages = _Pages(reader, token)
    routes = [
        Route("/", pages.runs),
        Route("/live", pages.live_all),
        # Instance ids may hold "/" (a sub-workflow's do): the longer routes are tried first.
        Route("/i/{instance:path}/blame/{key:path}", pages.blame),
        Route("/i/{instance:path}/state", pages.state),
        Route("/i/{instance:path}/graph", pages.graph),
        Route("/i/{instance:path}/diff", pages.diff),
        Route("/i/{instance:path}/live", pages.live_instance),
        Route("/i/{instance:path}", pages.instance),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    middleware = [Middleware(HostGuard, hosts=allowed_hosts, any_ip=any_ip_host)]
    if token:
        middleware.append(Middleware(_TokenCheck, token=token))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            NotFound: pages.not_found,
            404: pages.not_found,
            LogIntegrityError: pages.broken,
            DecodeError: pages.unreadable,
        },
    )


def dumps(value: Any) -> str:
    """A wire JSON tree as indented JSON text."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()

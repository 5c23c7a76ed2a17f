"""``steplog ui``: a read-only time-travel debugger in the browser (see ``docs/ui.md``).

``create_app(store)`` builds the Starlette application over a store (it never writes to it);
``serve`` runs it with uvicorn. Every page asks the projections' public API, as the CLI does.
Needs the ``ui`` extra (``pip install 'steplog[ui]'``).
"""

from projections.ui._app import (
    BROKEN_STATUS,
    PAGE_SIZE,
    TOKEN_COOKIE,
    UNREADABLE_STATUS,
    create_app,
)
from projections.ui._guard import LOOPBACK_HOSTS, SECURITY_HEADERS
from projections.ui._serve import DEFAULT_HOST, DEFAULT_PORT, allowed_names, needs_token, serve

__all__ = [
    "BROKEN_STATUS",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LOOPBACK_HOSTS",
    "PAGE_SIZE",
    "SECURITY_HEADERS",
    "TOKEN_COOKIE",
    "UNREADABLE_STATUS",
    "allowed_names",
    "create_app",
    "needs_token",
    "serve",
]

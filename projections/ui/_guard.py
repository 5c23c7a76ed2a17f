"""Which requests the UI answers at all, and what every answer carries.

DNS rebinding: a page of another site, whose name the attacker then points at 127.0.0.1, reaches
a loopback server under that other name; its requests carry it in the ``Host`` header. So a
request is answered only when ``Host`` names this server: a loopback name, the bound address,
or a name given with ``--allowed-host`` (and, bound off loopback, any IP address, which no DNS
answer can rebind). Any other is refused with status 400 and one short line.

Every answer then carries ``SECURITY_HEADERS``: a Content-Security-Policy that lets a page run
only the UI's own script and style files (no inline script or style, nothing from another
site), and forbids framing it (with ``X-Frame-Options`` for older browsers); no content type
sniffing; no ``Referer`` (a first address carries the access token).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LOOPBACK_HOSTS", "SECURITY_HEADERS", "HostGuard", "host_name", "is_address"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The host names a request may always give (``[::1]`` is written with brackets in ``Host``)."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)
"""The headers every answer carries."""
_RAW_HEADERS = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS]


def host_name(text: str) -> str | None:
    """The host a ``Host`` header (or an ``--allowed-host`` value) names: lower case, without
    its port, an IPv6 address without its brackets, without a final dot; None when ``text`` is
    not ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    text = text.strip().lower()
    if text.startswith("["):
        name, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        name, colon, port_text = text.partition(":")
        port = port_text if colon else None
    if port is not None and not port.isdigit():
        return None
    name = name.removesuffix(".")
    if not name or any(c in name for c in "/\\@?#[] ") or (":" in name and not is_address(name)):
        return None
    return name


def is_address(name: str) -> bool:
    """Whether ``name`` is an IP address (v4, or v6 without brackets)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: refuse a request whose ``Host`` is not one of ``hosts`` (names as
    ``host_name`` gives them), or, with ``any_ip``, an IP address; add ``SECURITY_HEADERS`` to
    every answer."""

    def __init__(self, app: ASGIApp, *, hosts: Collection[str], any_ip: bool = False) -> None:
        self.app = app
        self.hosts = frozenset(hosts)
        self.any_ip = any_ip

    def allows(self, header: str) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        name = host_name(header)
        return name is not None and (name in self.hosts or (self.any_ip and is_address(name)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = False

        async def guarded(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), *_RAW_HEADERS]}
            await send(message)

        header = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
        if self.allows(header):
            try:
                await self.app(scope, receive, guarded)
            except Exception:
                # A bug: answered here, with the headers (Starlette's outermost error layer, which
                # logs it once this re-raises, would answer without them); no detail is shown.
                if not started:
                    await PlainTextResponse("500: internal error", status_code=500)(
                        scope, receive, guarded
                    )
                raise
            return
        names = ", ".join(f"[{h}]" if ":" in h else h for h in sorted(self.hosts))
        refused = PlainTextResponse(
            f"400: this steplog ui does not answer to the host {header!r}. It answers to: "
            f"{names}{' and IP addresses' if self.any_ip else ''}; "
            "'steplog ui --allowed-host NAME' adds a name (this refuses DNS rebinding: another "
            "site reaching this server under its own name).\n",
            status_code=400,
        )
        await refused(scope, receive, guarded)

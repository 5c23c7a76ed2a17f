"""Running the UI: uvicorn on 127.0.0.1 by default; elsewhere only with an access token."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import secrets
import socket
from collections.abc import Callable

from kernel import EventStore
from projections._frontend._points import UsageError
from projections.ui._guard import LOOPBACK_HOSTS, host_name, is_address

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "allowed_names", "needs_token", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def needs_token(host: str) -> bool:
    """Whether binding ``host`` needs an access token: any host but a loopback address."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def serve(
    store: EventStore,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    reveal: bool = False,
    sensitive: tuple[str, ...] = (),
    allow_broken_chain: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    say: Callable[[str], None] = print,
) -> None:
    """Serve the UI over ``store`` until interrupted; ``say`` gets the address to open (with
    the token, generated when ``host`` is not a loopback address and none is given).

    Requests are answered only when their ``Host`` names this server (DNS rebinding): a
    loopback name, ``host`` itself, one of ``allowed_hosts`` (names, ``name:port`` or ``[v6]``),
    and, bound off loopback, any IP address (``projections.ui._guard``).

    The address is bound before anything is said: one that cannot be (a port in use, an
    address not of this machine) raises ``UsageError`` saying why, and nothing is served."""
    import uvicorn

    from projections.ui._app import create_app

    if token is None and needs_token(host):
        token = secrets.token_urlsafe(18)
    names = allowed_names((host, *allowed_hosts))
    app = create_app(
        store,
        token=token,
        reveal=reveal,
        sensitive=sensitive,
        allow_broken_chain=allow_broken_chain,
        allowed_hosts=(*LOOPBACK_HOSTS, *names),
        any_ip_host=needs_token(host),
    )
    shown = f"[{host}]" if ":" in host else host
    sock = _bind(host, port, f"http://{shown}:{port}/")
    with sock:
        address = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
        say(f"steplog ui: serving {store.url} (read only) at {address}  (Ctrl-C stops)")
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C ends it quietly
            uvicorn.Server(config).run(sockets=[sock])


def allowed_names(given: tuple[str, ...]) -> tuple[str, ...]:
    """The host names ``given`` (``--allowed-host``, the bound host) as requests give them;
    ``UsageError`` for one that is not a host name (a wildcard address names no host: left out)."""
    names: list[str] = []
    for text in given:
        bare_v6 = ":" in text and not text.startswith("[") and is_address(text)
        name = host_name(f"[{text}]" if bare_v6 else text)
        if name is None:
            raise UsageError(f"{text!r} is not a host name (give a name, an address or [v6])")
        if name not in ("0.0.0.0", "::"):
            names.append(name)
    return tuple(names)


def _bind(host: str, port: int, address: str) -> socket.socket:
    """A socket bound to ``host``:``port`` (uvicorn listens on it), or ``UsageError``."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a port in use
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        why = (
            "the port is in use (by another program, or another steplog ui): stop it, or "
            "choose another port"
            if error.errno == errno.EADDRINUSE
            else (error.strerror or str(error))
        )
        raise UsageError(f"cannot serve at {address}: {why}") from error
    return sock

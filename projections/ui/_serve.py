"""Running the UI: uvicorn on 127.0.0.1 by default; elsewhere only with an access token."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Callable

from kernel import EventStore

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "needs_token", "serve"]

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
    say: Callable[[str], None] = print,
) -> None:
    """Serve the UI over ``store`` until interrupted; ``say`` gets the address to open (with
    the token, generated when ``host`` is not a loopback address and none is given)."""
    import uvicorn

    from projections.ui._app import create_app

    if token is None and needs_token(host):
        token = secrets.token_urlsafe(18)
    app = create_app(store, token=token, reveal=reveal, sensitive=sensitive)
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    say(f"steplog ui: serving {store.url} (read only) at {address}  (Ctrl-C stops)")
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)

"""Store URLs: split them, refusing malformed ones, and never show their password.

A store URL may carry a password (``postgresql://user:password@host/db``). Whatever steplog
shows of a URL (an error message, ``store.url``, ``repr(store)``, a log line, the CLI's output)
goes through ``mask_url``, which replaces the password with ``***`` and keeps the user name; and
whatever text a driver gives back about a connection goes through ``hide`` with the URL's
secrets, in case the driver quoted them.

``mask_url`` works on text that is not a valid URL too: everything between ``scheme://user:`` and
the last ``@`` of the URL is taken as the password. A password holding an unencoded ``/`` or
``@`` is thus hidden whole; the cost is that a URL without a password but with an ``@`` after a
``host:port`` is shown with more hidden than needed.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, unquote, urlsplit

from kernel._base._errors import StoreConfigError

__all__ = ["MASK", "hide", "mask_url", "split_url", "url_secrets"]

MASK = "***"
"""What a password is shown as."""

_USERINFO = re.compile(
    r"^(?P<head>\s*[A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*):(?P<secret>.*)@", re.DOTALL
)
"""``scheme://user:`` (the head), then the password: up to the last ``@``."""


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; the user name is kept.

    >>> mask_url("postgresql://app:s3cret@db.example:5432/prod")
    'postgresql://app:***@db.example:5432/prod'
    >>> mask_url("sqlite:////var/lib/app/steplog.db")
    'sqlite:////var/lib/app/steplog.db'
    """
    found = _USERINFO.match(url)
    if found is None:
        return url
    return f"{found['head']}:{MASK}@{url[found.end() :]}"


def url_secrets(url: str) -> tuple[str, ...]:
    """The password of ``url`` as written and percent-decoded (empty when there is none), longest
    first: the text ``hide`` removes from messages about this URL."""
    found = _USERINFO.match(url)
    if found is None:
        return ()
    secrets = {found["secret"], unquote(found["secret"])}
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        secrets |= {password, unquote(password)}
    return tuple(sorted((s for s in secrets if s), key=len, reverse=True))


def hide(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every occurrence of each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def split_url(url: str) -> SplitResult:
    """``urlsplit(url)``, with its port checked; a malformed URL raises ``StoreConfigError``
    naming what is wrong, with the URL's password masked (``sqlite://[::1/x.db``: "store URL
    'sqlite://[::1/x.db' is malformed: Invalid IPv6 URL (a '[' or ']' without its pair in the host
    part)")."""
    found = _USERINFO.match(url)
    try:
        parts = urlsplit(url)
    except ValueError as error:
        reason = hide(str(error), url_secrets(url))
        hint = _HINTS.get(reason, "")
        shown = mask_url(url)
        raise StoreConfigError(f"store URL {shown!r} is malformed: {reason}{hint}") from None
    cut = found is not None and parts.password != found["secret"]
    if not cut:
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError as error:
            reason = hide(str(error), url_secrets(url))
            shown = mask_url(url)
            raise StoreConfigError(f"store URL {shown!r} has a bad port: {reason}") from None
    if cut:
        raise StoreConfigError(
            f"store URL {mask_url(url)!r} is malformed: its password is cut short by a '/', "
            "'?' or '#' (percent-encode them in a password: %2F, %3F, %23)"
        )
    return parts


_HINTS = {
    "Invalid IPv6 URL": " (a '[' or ']' without its pair in the host part)",
}

"""Encryption at rest: AES-256-GCM with keys the user holds (``Keyring``).

A sealed value is ``MAGIC + key id (8 bytes) + nonce (12 bytes) + ciphertext and tag``. The key
id is a fingerprint of the key (never the key), so that a value sealed with a key that is not
configured is told apart from one that was altered: the first is "wrong or missing key", the
second a ``LogIntegrityError``. Every seal binds its place with associated data (for an event
row: its instance, last position and count), so a sealed value moved to another place does not
open. AES-GCM comes from ``cryptography`` (its ``AESGCM``), never from hand-written code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, TypeAlias

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kernel._base._errors import LogIntegrityError, MissingKeyError, StoreConfigError

__all__ = ["FROM_ENV", "KEYS_ENV", "MAGIC", "Keyring", "KeyringChoice", "is_sealed", "keyring_from"]

KEYS_ENV = "STEPLOG_KEYS"
"""The environment variable keys are read from (by ``open_store`` and the CLI): base64 keys
separated by commas, whitespace or line breaks, the first the one that encrypts
(``Keyring.from_text``)."""

FROM_ENV: Literal["env"] = "env"
"""``open_store``'s default ``keyring``: the keys in ``$STEPLOG_KEYS`` (none when it is unset or
empty). ``keyring=None`` opts out: a store in plain text, asked for explicitly."""

MAGIC = b"\x00SL1"
"""How a sealed value begins; no JSON document begins with a NUL byte."""
_KEY_ID = 8
_NONCE = 12
_HEADER = len(MAGIC) + _KEY_ID + _NONCE
_TAG = 16
_MAKE_ONE = "'steplog keygen' (or, in Python, Keyring.generate())"
"""How an error about a key's text says to make one: for users of the CLI and of the API."""


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` was sealed by a ``Keyring`` (rather than being plain JSON)."""
    return data[:4] == MAGIC


def key_id(key: bytes) -> bytes:
    """The fingerprint a sealed value names its key by: 8 bytes, from which the key cannot be
    recovered."""
    return hashlib.blake2b(key, digest_size=_KEY_ID, person=b"steplog-key-id").digest()


class Keyring:
    """The keys of an encrypted store: the first encrypts, all of them decrypt.

    Each key is 32 random bytes (``Keyring.generate()`` makes one, as text). To rotate, put the
    new key first and keep the old ones after it: new rows are sealed with the new key, old rows
    still open with theirs (``docs/security.md``). The keys themselves are never written anywhere,
    and ``repr`` shows only their fingerprints.

    >>> ring = Keyring.from_text(Keyring.generate())
    >>> ring.open(ring.seal(b"secret", b"here"), b"here", "example")
    b'secret'
    """

    def __init__(
        self,
        keys: Sequence[bytes],
        *,
        nonces: Callable[[int], bytes] = os.urandom,
        source: str = "the keyring",
    ):
        if not keys:
            raise StoreConfigError("a keyring needs at least one key")
        self._ciphers: dict[bytes, AESGCM] = {}
        self._tags: dict[bytes, bytes] = {}
        """Per key fingerprint, the key that authenticates (``tag``): derived from the key, never
        the key itself."""
        for n, key in enumerate(keys, start=1):
            if not isinstance(key, bytes) or len(key) != 32:
                size = len(key) if isinstance(key, bytes) else type(key).__name__
                raise StoreConfigError(
                    f"key {n} of {source} is not 32 bytes ({size}); make one with {_MAKE_ONE}"
                )
            self._ciphers.setdefault(key_id(key), AESGCM(key))
            self._tags.setdefault(
                key_id(key), hashlib.blake2b(b"steplog-tag-key-1", key=key, digest_size=32).digest()
            )
        self.current = key_id(keys[0])
        """The fingerprint of the key that seals."""
        self._nonces = nonces

    @staticmethod
    def generate() -> str:
        """A new random key, as the URL-safe base64 text that ``from_text`` reads."""
        return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")

    @staticmethod
    def fingerprint_of(sealed: bytes) -> str:
        """The fingerprint (hex) of the key that ``sealed`` (a value ``seal`` made) names: which
        key opens it, told without any key."""
        return sealed[len(MAGIC) : len(MAGIC) + _KEY_ID].hex()

    @classmethod
    def from_text(cls, text: str, *, source: str = "the keyring") -> Keyring:
        """The keyring of ``text``: base64 keys separated by commas, whitespace or line breaks
        (one key per line is fine), the first one sealing. Each key must be whole base64 text
        (``generate``'s 44 characters): a part that is not, one with anything after its padding,
        or an empty part between two commas is a ``StoreConfigError`` that names the key's place
        (its number, in ``source``: where the text came from), never its text; no key is ever
        dropped."""
        keys = []
        parts = text.split(",")
        for n, part in enumerate(_key_texts(parts), start=1):
            if not part:
                raise StoreConfigError(
                    f"key {n} of {source} is empty (two commas in a row, or a comma at an "
                    "end); separate keys by one comma, a space or a line break"
                )
            try:
                keys.append(base64.b64decode(part.encode("ascii"), altchars=b"-_", validate=True))
            except (binascii.Error, ValueError, UnicodeEncodeError):
                raise StoreConfigError(
                    f"key {n} of {source} is not base64 text; make one with {_MAKE_ONE}"
                ) from None
        return cls(keys, source=source)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Keyring | None:
        """The keyring in ``environ[KEYS_ENV]``, None when it is unset or empty."""
        text = environ.get(KEYS_ENV, "").strip()
        return cls.from_text(text, source=f"${KEYS_ENV}") if text else None

    @property
    def fingerprints(self) -> list[str]:
        """The keys' fingerprints in hex, the sealing one first."""
        return [self.current.hex()] + [k.hex() for k in self._ciphers if k != self.current]

    def seal(self, plain: bytes, place: bytes) -> bytes:
        """``plain`` encrypted and authenticated with the current key, bound to ``place``."""
        nonce = self._nonces(_NONCE)
        sealed = self._ciphers[self.current].encrypt(nonce, plain, place)
        return b"".join((MAGIC, self.current, nonce, sealed))

    def open(self, sealed: bytes, place: bytes, where: str) -> bytes:
        """The plain bytes of a value sealed at ``place``. Raises ``MissingKeyError`` (a
        ``DecodeError``) when its key is not in this keyring (wrong or missing key), and
        ``LogIntegrityError`` when the value was altered or moved; ``where`` names it."""
        if len(sealed) < _HEADER + _TAG or not is_sealed(sealed):
            raise LogIntegrityError(f"{where} is not a whole encrypted value (cut short?)")
        found = sealed[4 : 4 + _KEY_ID]
        cipher = self._ciphers.get(found)
        if cipher is None:
            raise MissingKeyError(
                f"{where} is encrypted with key {found.hex()}, which is not in the keyring "
                f"({', '.join(self.fingerprints)}): give that key (in {KEYS_ENV} or "
                "open_store(keyring=...))",
                where=where,
                key=found.hex(),
                given=tuple(self.fingerprints),
            )
        try:
            return cipher.decrypt(sealed[4 + _KEY_ID : _HEADER], sealed[_HEADER:], place)
        except InvalidTag:
            raise LogIntegrityError(
                f"{where} does not decrypt with its key {found.hex()}: it was altered or moved "
                "since it was written"
            ) from None

    def tag(self, message: bytes) -> str:
        """An authentication tag of ``message`` with the current key: its fingerprint and an
        HMAC-SHA256 with a key derived from it, as hex (``fingerprint:hmac``)."""
        digest = hmac.new(self._tags[self.current], message, hashlib.sha256).hexdigest()
        return f"{self.current.hex()}:{digest}"

    def tag_matches(self, tag: str, message: bytes) -> bool | None:
        """Whether ``tag`` (made by ``tag``) authenticates ``message``: None when the key it
        names is not in this keyring (it cannot tell), False when it does not match."""
        found, _, digest = tag.partition(":")
        try:
            key = self._tags.get(bytes.fromhex(found))
        except ValueError:
            return False
        if key is None:
            return None
        expected = hmac.new(key, message, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), digest.encode("ascii", "replace"))

    def __repr__(self) -> str:
        return f"Keyring({', '.join(self.fingerprints)})"


KeyringChoice: TypeAlias = "Keyring | Literal['env'] | None"
"""What ``open_store(keyring=...)`` takes: a ``Keyring``, ``FROM_ENV`` or ``None``."""


def keyring_from(choice: KeyringChoice, environ: Mapping[str, str]) -> Keyring | None:
    """The keyring a store is opened with, by the one rule of where keys come from: the
    ``Keyring`` given; ``FROM_ENV`` (``open_store``'s default, so also the builder's default
    store and the CLI's): the keys in ``environ[KEYS_ENV]``, none when it is unset or empty;
    ``None``: no keys, the explicit opt-out. Anything else is a ``StoreConfigError``, and so is
    text in ``KEYS_ENV`` that is not keys (``Keyring.from_text``)."""
    if isinstance(choice, Keyring) or choice is None:
        return choice
    if choice == FROM_ENV:
        return Keyring.from_env(environ)
    shown = type(choice).__name__
    raise StoreConfigError(
        f"keyring must be a kernel.Keyring, kernel.FROM_ENV or None, not {shown}"
    )


def _key_texts(parts: Sequence[str]) -> list[str]:
    """The keys of ``parts`` (``text`` cut at its commas), each part cut again at whitespace;
    a part with nothing in it stays, empty, for ``from_text`` to refuse."""
    return [key for part in parts for key in (part.split() or [""])]


def sealed_without_key(where: str, sealed: bytes) -> MissingKeyError:
    """The error for an encrypted value read by a store opened without keys."""
    found = Keyring.fingerprint_of(sealed)
    return MissingKeyError(
        f"{where} is encrypted (key {found}); open the store with its key: {KEYS_ENV}=... or "
        "open_store(url, keyring=Keyring.from_text(...))",
        where=where,
        key=found,
    )

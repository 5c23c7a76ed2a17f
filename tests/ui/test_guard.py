"""DNS rebinding and the browser's protections (issue 21): the UI answers only requests whose
``Host`` names it (the loopback names, the bound address, ``--allowed-host``), and every answer
carries a strict Content-Security-Policy, ``X-Frame-Options``, ``nosniff`` and a Referrer-Policy.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from kernel import EventStore
from projections.cli import EXIT_BAD_INPUT, main
from projections.ui import SECURITY_HEADERS, create_app, serve
from tests.ui.conftest import DEMO, LOCAL, Server
from tests.ui.test_pages import free_port

LOOPBACK = ["http://127.0.0.1", "http://127.0.0.1:8765", "http://localhost:8765",
            "http://LOCALHOST", "http://[::1]:8765", "http://[::1]"]  # fmt: skip


def guarded(response: httpx.Response) -> None:
    """``response`` carries every protection, the strict policy as it is meant."""
    for name, value in SECURITY_HEADERS:
        assert response.headers.get(name) == value, (name, response.headers)
    policy = dict(
        part.strip().split(" ", 1)
        for part in response.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert "unsafe" not in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"


def refused(response: httpx.Response, host: str) -> None:
    assert response.status_code == 400, (host, response.status_code)
    assert response.headers["content-type"].startswith("text/plain")
    assert "does not answer to the host" in response.text
    assert "--allowed-host" in response.text
    assert DEMO not in response.text  # nothing of the store
    guarded(response)


def test_a_request_for_another_host_is_refused_even_on_loopback(demo_store: EventStore) -> None:
    """The rebinding attack: a page of attacker.example, its name then resolved to 127.0.0.1."""
    app = create_app(demo_store)
    for base in ["http://attacker.example", "http://attacker.example:8765",
                 "http://127.0.0.1.attacker.example", "http://localhost.evil:80"]:  # fmt: skip
        with TestClient(app, base_url=base) as client:
            for path in ["/", f"/i/{DEMO}", f"/i/{DEMO}/state", "/static/ui.js", "/live"]:
                refused(client.get(path), base)
    for base in LOOPBACK:
        with TestClient(app, base_url=base) as client:
            assert client.get("/").status_code == 200, base


def test_a_real_server_refuses_a_foreign_host_header(server: Server) -> None:
    with httpx.Client(timeout=30) as http:
        for host in ["attacker.example", "attacker.example:8765", "", "127.0.0.1:80x",
                     "[::1", "::1", "a@127.0.0.1"]:  # fmt: skip
            refused(http.get(server.url + "/", headers={"Host": host}), host)
        port = server.url.rsplit(":", 1)[1]
        for host in [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]:
            answered = http.get(server.url + "/", headers={"Host": host})
            assert answered.status_code == 200, host
            guarded(answered)


def test_every_answer_carries_the_protections(
    client: TestClient, server: Server, demo_store: EventStore
) -> None:
    for path, status in [("/", 200), (f"/i/{DEMO}", 200), (f"/i/{DEMO}/state", 200),
                         (f"/i/{DEMO}/diff", 200), (f"/i/{DEMO}/graph", 200),
                         ("/static/ui.js", 200), ("/static/ui.css", 200),
                         ("/i/no-such-thing", 404), ("/nothing/here", 404)]:  # fmt: skip
        response = client.get(path)
        assert response.status_code == status, path
        guarded(response)
    with TestClient(create_app(demo_store, token="s3cret"), base_url=LOCAL) as needs_token:
        assert needs_token.get("/").status_code == 403
        guarded(needs_token.get("/"))  # the token page too
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{server.url}/i/{DEMO}/live") as stream,
    ):
        assert stream.status_code == 200
        guarded(stream)  # the live stream too


def test_the_pages_hold_no_inline_script_or_style(client: TestClient) -> None:
    """What the policy forbids is not in any page (the browser tests run them under it)."""
    for path in ["/", f"/i/{DEMO}", f"/i/{DEMO}/state", f"/i/{DEMO}/diff", f"/i/{DEMO}/graph",
                 f"/i/{DEMO}/blame/total", "/i/no-such-thing"]:  # fmt: skip
        page = client.get(path).text
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == [], path
        assert "<style" not in page, path
        tags = re.findall(r"<[a-zA-Z][^<>]*>", page)  # stored text is escaped: not a tag
        assert [t for t in tags if re.search(r"\s(?:style|on[a-z]+)=", t)] == [], path
        assert "javascript:" not in page, path


def served_app(monkeypatch: pytest.MonkeyPatch, store: EventStore, **options: Any) -> Any:
    """The application ``serve`` would run with ``options`` (bound to a free port, not run)."""
    apps = captured(monkeypatch)
    serve(store, port=free_port(), say=lambda _: None, **options)
    return apps[0]


def captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The applications uvicorn is given to run (it runs none)."""
    apps: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: apps.append(self.config.app))
    return apps


def test_allowed_hosts_are_answered_and_only_them(
    demo_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = served_app(monkeypatch, demo_store, allowed_hosts=("ui.example", "Proxy.Example:443"))
    for base in [*LOOPBACK, "http://ui.example", "http://ui.example:8765", "http://proxy.example"]:
        with TestClient(app, base_url=base) as client:
            assert client.get("/").status_code == 200, base
    for base in ["http://attacker.example", "http://192.168.1.4", "http://ui.example.evil"]:
        with TestClient(app, base_url=base) as client:
            refused(client.get("/"), base)


def test_off_loopback_the_host_is_checked_too(
    demo_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bound to every address (with its token): a name is answered only when allowed; an IP
    address (which no DNS answer rebinds) is."""
    app = served_app(
        monkeypatch, demo_store, host="0.0.0.0", token="t0k", allowed_hosts=("ui.lan",)
    )
    for base in ["http://ui.lan:8765", "http://192.168.1.4:8765", "http://[fe80::1]", *LOOPBACK]:
        with TestClient(app, base_url=base) as client:
            assert client.get("/", params={"token": "t0k"}).status_code == 200, base
    with TestClient(app, base_url="http://attacker.example:8765") as client:
        refused(client.get("/", params={"token": "t0k"}), "attacker.example")


def test_the_command_takes_allowed_hosts(
    demo_store: EventStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apps = captured(monkeypatch)
    port = str(free_port())
    url = demo_store.url
    assert main(["--store", url, "ui", "--port", port, "--allowed-host", "ui.example"]) == 0
    # (the command closed its store when uvicorn returned: the static files still answer)
    with TestClient(apps[0], base_url="http://ui.example") as client:
        assert client.get("/static/ui.css").status_code == 200
    with TestClient(apps[0], base_url="http://other.example") as client:
        refused(client.get("/static/ui.css"), "other.example")
    capsys.readouterr()
    assert main(["--store", url, "ui", "--port", port, "--allowed-host", "a/b"]) == EXIT_BAD_INPUT
    assert "'a/b' is not a host name" in capsys.readouterr().err


def test_an_unexpected_error_is_a_plain_500_with_the_protections_too(
    demo_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a page (any exception the pages do not handle) is answered 500 with the same
    headers as every other answer, and without its text (which could hold stored values)."""
    from projections.ui._data import Reader

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("secret-ish detail of a bug")

    monkeypatch.setattr(Reader, "instances", broken)
    with TestClient(
        create_app(demo_store), base_url=LOCAL, raise_server_exceptions=False
    ) as client:
        response = client.get("/")
    assert response.status_code == 500
    assert "secret-ish" not in response.text
    guarded(response)

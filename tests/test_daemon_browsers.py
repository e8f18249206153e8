"""Issue #28, finding 6: a browser as the client of a ``loopfuse serve`` on loopback with no
token. Another site's page may send a cross-site "simple" POST (``text/plain``, a form) and
may rebind its DNS name to 127.0.0.1; neither reaches the API, and no CORS header is sent
unless the operator names origins.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import msgspec
import pytest

from orchestrator.daemon import open_daemon
from tests.daemon_support import daemon_config, daemon_process

WAIT = 30.0
RUN = json.dumps({"scenario": "completed"}).encode()


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text


@pytest.mark.asyncio
async def test_cross_site_posts_and_foreign_hosts_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "loopfuse.toml"
    config.write_text(
        f"[daemon]\nstore_path = {json.dumps(str(tmp_path / 'daemon.db'))}\n", encoding="utf-8"
    )
    with daemon_process(config, tmp_path / "daemon.log") as (_, url):
        port = urlsplit(url).port
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
            # What a page's <form> or fetch(no-cors) can send, with no preflight.
            for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
                headers = {"Content-Type": content_type} if content_type else {}
                refused = await http.post("/v1/runs", content=RUN, headers=headers)
                _error(refused, 415, "unsupported_media_type")
            refused = await http.post(
                "/v1/runs/x/abort", content=b"{}", headers={"Content-Type": "text/plain"}
            )
            _error(refused, 415, "unsupported_media_type")

            # A name rebound to 127.0.0.1 is not this daemon's.
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
                _error(await http.get("/healthz", headers={"Host": host}), 400, "bad_host")
                refused = await http.post(
                    "/v1/runs", json={"scenario": "completed"}, headers={"Host": host}
                )
                _error(refused, 400, "bad_host")
            served = (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST")
            for host in (*served, "10.1.2.3:8470", "[fe80::1]"):  # an address can't be rebound
                assert (await http.get("/healthz", headers={"Host": host})).status_code == 200

            # No CORS: a preflight and a cross-origin GET get no Access-Control header.
            preflight = await http.options(
                "/v1/runs",
                headers={
                    "Origin": "https://evil.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type",
                },
            )
            listed = await http.get("/v1/runs", headers={"Origin": "https://evil.example"})
            assert not [h for h in preflight.headers if h.lower().startswith("access-control")]
            assert not [h for h in listed.headers if h.lower().startswith("access-control")]
            assert listed.json()["runs"] == []  # nothing above started a run

            accepted = await http.post(
                "/v1/runs", content=RUN, headers={"Content-Type": "application/json; charset=utf-8"}
            )
            assert accepted.status_code == 202, accepted.text

        # Two Host headers: which one is meant? Neither.
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        async with await anyio.connect_tcp(parts.hostname, parts.port) as stream:
            await stream.send(
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n"
                b"Connection: close\r\n\r\n"
            )
            answer = b""
            with anyio.fail_after(WAIT):
                try:
                    while True:
                        answer += await stream.receive()
                except anyio.EndOfStream:
                    pass
        assert answer.startswith(b"HTTP/1.1 400 "), answer


@pytest.mark.asyncio
async def test_names_and_origins_the_operator_adds_are_served(tmp_path: Path) -> None:
    base = daemon_config(tmp_path)
    daemon = msgspec.structs.replace(
        base.daemon, allowed_hosts=("dash.example",), cors_origins=("https://dash.example",)
    )
    config = msgspec.structs.replace(base, daemon=daemon)
    async with (
        open_daemon(config) as running,
        httpx.AsyncClient(base_url=running.url, timeout=WAIT) as http,
    ):
        assert (await http.get("/healthz", headers={"Host": "dash.example:443"})).status_code == 200
        _error(await http.get("/healthz", headers={"Host": "evil.example"}), 400, "bad_host")
        preflight = await http.options(
            "/v1/runs",
            headers={
                "Origin": "https://dash.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == "https://dash.example"
        other = await http.get("/v1/runs", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers

"""The slow tests' client for real servers resends once when a connection closes unanswered, and
only once: a server that never answers still fails the test."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from ..support.helpers import api_client


def closing_server(unanswered: int) -> tuple[str, threading.Thread]:
    """A loopback HTTP server that closes its first `unanswered` connections after reading a request,
    then answers 200 on the next one."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        with sock:
            for i in range(unanswered + 1):
                conn, _ = sock.accept()
                with conn:
                    conn.recv(65536)
                    if i == unanswered:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", t


def test_a_connection_closed_unanswered_is_sent_again():
    url, t = closing_server(unanswered=1)
    with api_client(url, 10) as client:
        r = client.post("/v1/chat/completions", json={"x": 1})
    assert (r.status_code, r.text) == (200, "ok")
    t.join(5)


def test_a_server_that_never_answers_still_fails():
    url, _ = closing_server(unanswered=2)
    # closed unanswered twice: a clean close, or a reset when the host is loaded
    with api_client(url, 10) as client, pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        client.post("/v1/chat/completions", json={"x": 1})

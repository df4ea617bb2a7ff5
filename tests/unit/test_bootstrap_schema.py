"""A node's OVSDB that takes the connection and never answers (a hung host, a rogue listener) fails
the node's check within its timeout instead of holding it for ever (a real ovsdb-server's schema:
tests/unit/test_bootstrap_ofports.py, every lab)."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from fathom.controller import channels
from fathom.controller.bootstrap import fetch_schema
from fathom.lab.controller import free_port
from fathom.pki import Pki


@pytest.fixture
def silent():
    """A listener whose connections the kernel completes and nobody ever reads or answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        yield listener.getsockname()[1]


def test_a_silent_ovsdb_over_tcp_times_out(silent):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not send its schema"):
        fetch_schema(f"tcp:127.0.0.1:{silent}", 0.5)
    assert 0.4 < time.monotonic() - t0 < 3


def test_a_silent_ovsdb_over_tls_times_out_in_the_handshake(silent, tmp_path):
    Pki(tmp_path / "pki").init()
    saved = channels.current()
    channels.use_tls(str(tmp_path / "pki"))
    try:
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="cannot connect"):
            fetch_schema(f"ssl:127.0.0.1:{silent}", 0.5)
        assert 0.4 < time.monotonic() - t0 < 3
    finally:
        channels._current = saved


def test_a_closed_port_fails_at_once():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot connect"):
        fetch_schema(f"tcp:127.0.0.1:{port}", 5)
    assert time.monotonic() - t0 < 2


def test_a_tls_handshake_cut_off_says_so(tmp_path):
    """A node whose OVSDB takes the TCP connection and closes it in the handshake (not configured
    for TLS yet): the status names the TLS handshake, not the errno of the same number
    (SSL_ERROR_EOF 8 "Exec format error", SSL_ERROR_ZERO_RETURN 6 "No such device or address")."""
    Pki(tmp_path / "pki").init()
    saved = channels.current()
    channels.use_tls(str(tmp_path / "pki"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        def close_after_hello():   # read the ClientHello first: closing with it unread would send a reset
            conn = listener.accept()[0]
            conn.recv(65536)
            conn.close()
        closer = threading.Thread(target=close_after_hello, daemon=True)
        closer.start()
        try:
            with pytest.raises(ConnectionError) as e:
                fetch_schema(f"ssl:127.0.0.1:{port}", 5)
        finally:
            channels._current = saved
    assert "the node closed the connection in the TLS handshake (SSL_ERROR_" in str(e.value)
    assert "Exec format error" not in str(e.value) and "No such device" not in str(e.value)

"""Reading OpenFlow messages off a socket in the tests that talk to a simulated switch."""
from __future__ import annotations

import socket

from fathom.bench.ofswitch import HEADER


def read_message(conn: socket.socket) -> tuple[int, int, bytes]:
    """The next message on `conn`: (type, xid, body after the header)."""
    head = b""
    while len(head) < HEADER.size:
        head += conn.recv(HEADER.size - len(head))
    _, msg_type, length, xid = HEADER.unpack(head)
    body = b""
    while len(body) < length - HEADER.size:
        body += conn.recv(length - HEADER.size - len(body))
    return msg_type, xid, body

"""A TLS connection that one thread reads while another writes.

os-ken serves each switch with a thread that reads its socket and another that writes it. An
OpenSSL connection must not be used by two threads at once, and CPython's `ssl` module does not
serialise them: a read running beside a write can end in a spurious EOF or error, and os-ken then
drops the switch (and the reconciler re-reads its whole table). `SerialTLSSocket` makes every call
into the TLS connection under one lock; the socket underneath is non-blocking, and waiting for it
to become readable or writable happens outside the lock, so a reader waiting for the switch never
holds up a writer. `close` shuts the connection down, which wakes a thread waiting on the socket
(closing a descriptor does not wake a poll on it), and closes the socket once no thread waits on its
descriptor (a number closed under a wait could be given to another socket meanwhile).
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time


class SerialTLSSocket:
    """The part of a socket os-ken's `Datapath` uses (recv, sendall, settimeout, setsockopt,
    shutdown, close) over an established `ssl.SSLSocket`."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._lock = threading.Lock()
        self._timeout: float | None = sock.gettimeout()
        self._shut = False
        self._closed = False    # close asked: the last thread to leave its wait closes the socket
        self._waiting = 0       # threads waiting on the socket's descriptor outside the lock
        sock.setblocking(False)

    def settimeout(self, timeout: float | None) -> None:
        """How long recv and sendall wait for the socket (None: forever), as on a socket."""
        self._timeout = timeout

    def setsockopt(self, *args) -> None:
        self._sock.setsockopt(*args)

    def getpeercert(self, binary_form: bool = False):
        return self._sock.getpeercert(binary_form)

    def fileno(self) -> int:
        return self._sock.fileno()

    def _call(self, op, *args):
        """Run one TLS operation under the lock, waiting outside it for what it wants."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            with self._lock:
                if self._shut:
                    return None
                try:
                    return op(*args)
                except ssl.SSLWantReadError:
                    events = select.POLLIN
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise socket.timeout("timed out")
                fd = self._sock.fileno()
                self._waiting += 1
            try:
                poller = select.poll()
                poller.register(fd, events)
                poller.poll(None if wait is None else wait * 1000)
            finally:
                with self._lock:
                    self._waiting -= 1
                    if self._closed and not self._waiting:
                        self._sock.close()

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" once the peer or our shutdown ended the connection."""
        return self._call(self._sock.recv, size) or b""

    def sendall(self, data) -> None:
        view = memoryview(data)
        while view:
            # OpenSSL writes a buffer whole or asks for the same buffer again (its records are
            # already under way), so the retry inside _call passes the same view
            sent = self._call(self._sock.send, view)
            if sent is None:
                raise BrokenPipeError("TLS connection shut down")
            view = view[sent:]

    def shutdown(self, how: int) -> None:
        """End the connection for both threads: later reads see EOF, later writes fail."""
        with self._lock:
            self._shut = True
            self._sock.shutdown(how)

    def close(self) -> None:
        """End the connection, waking a thread waiting on the socket; the socket is closed once
        no thread waits on its descriptor."""
        with self._lock:
            self._shut = self._closed = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass        # not connected any more, or closed already
            if not self._waiting:
                self._sock.close()

"""HAProxy in front of the API with deploy/haproxy/fathom-api.cfg, the file docs/security.md shows:
TLS, the client's address through X-Forwarded-For (trusted only from the proxy's own address),
its per-client connection limit and its deadline for a slow head."""
from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fathom.agent.http import JsonClient
from fathom.api.connections import ConnectionLimits
from fathom.lab.controller import free_port

from .test_connections import Server, closed

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy/haproxy/fathom-api.cfg"


def test_the_documented_config_is_the_file():
    doc = (ROOT / "docs/security.md").read_text()
    shown = re.search(r"`deploy/haproxy/fathom-api.cfg`:\n\n```\n(.*?)```", doc, re.S)
    assert shown and shown.group(1) == CONFIG.read_text()


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: (haproxy's PEM, the clients' CA file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controller.mgmt")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "api.pem").write_bytes(cert_pem + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "ca.pem").write_bytes(cert_pem)
    return directory / "api.pem", directory / "ca.pem"


@pytest.fixture
def proxied(tmp_path, monkeypatch):
    """The API (trusting 127.0.0.2, the proxy's address) behind HAProxy on 127.0.0.1:<port> over TLS."""
    monkeypatch.setenv("FATHOM_API_BODY_TIMEOUT", "10")
    srv = Server(tmp_path, ConnectionLimits(source_rate=0.01, source_burst=1,
                                            trusted_proxies=frozenset({"127.0.0.2"})))
    pem, ca = _certificate(tmp_path)
    port = free_port()
    env = {**os.environ, "FATHOM_API_BIND": f"127.0.0.1:{port}", "FATHOM_API_CERT": str(pem),
           "FATHOM_API_BACKEND": f"127.0.0.1:{srv.port}"}
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(CONFIG)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proxy.poll() is None and time.monotonic() < deadline, proxy.stdout.read()
            time.sleep(0.05)
    yield srv, port, ca
    proxy.terminate()
    proxy.wait(10)
    srv.stop()


def _tls(port: int, ca: Path, source: str) -> ssl.SSLSocket:
    sock = socket.socket()
    sock.settimeout(15)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return ssl.create_default_context(cafile=str(ca)).wrap_socket(sock, server_hostname="127.0.0.1")


def test_through_the_proxy(proxied):
    srv, port, ca = proxied
    # a node's client over HTTPS, trusting the proxy's certificate (FATHOM_CACERT)
    client = JsonClient(f"https://127.0.0.1:{port}", headers={"Authorization": srv.token}, verify=str(ca))
    assert client.get("/v1/networks").status_code == 200
    client.close()
    # requests without a token are limited per client address, the one the proxy forwards; an
    # X-Forwarded-For the client sends itself changes nothing
    statuses = []
    for source, forged in (("127.0.0.5", ""), ("127.0.0.5", "X-Forwarded-For: 198.18.0.9\r\n"),
                           ("127.0.0.6", "")):
        with _tls(port, ca, source) as sock:
            statuses.append(srv.get(sock, extra=forged)[9:12])
    assert statuses == [b"401", b"429", b"401"]
    # at most 64 connections at once from one client address
    held = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.7", 0)) for _ in range(70)]
    time.sleep(0.5)
    assert sum(closed(s, 0.01) for s in held) == 6
    for s in held:
        s.close()
    # a head that never completes: the proxy answers 408 and closes within 10 s
    with _tls(port, ca, "127.0.0.8") as sock:
        sock.sendall(b"GET /v1/networks HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 11, reply[:100]

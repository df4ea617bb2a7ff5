"""How the controller reaches the switches: OVSDB and OpenFlow over TLS (default) or plain TCP.

With TLS the controller holds the certificate `controller` of a fathom PKI (fathom.pki): it serves
OpenFlow with it and presents it to every node's OVSDB server, and it accepts only peers whose
certificate the switch CA signed. Plain TCP only when asked for (`fathom controller --insecure`).

The OVS Python library keeps its TLS files per process (ovs.stream.Stream), so the transport is one
process-wide setting too, made once at start by `use_tls` or `use_plain_tcp`.
"""
from __future__ import annotations

import ssl
import sys
from dataclasses import dataclass

from fathom.pki import CONTROLLER_NAME, Files, Pki

OVSDB_PORT = 6640
# The inactivity probe of the OVSDB connection between the controller and a node's ovsdb-server, in
# ms, on both ends (our client: fathom.controller.bootstrap; the node's Manager row: `ovs-vsctl set
# Manager <target> inactivity_probe=30000`, docs/deploy.md): an echo after that long without a
# word, a reconnect after as long again. Nothing is lost meanwhile: a lost update is what the
# reconciler's check looks for, and a node that died is dropped by its OpenFlow keepalive.
# ovsdb-server's default, 5 s, would exchange an echo every 5 s with every node at rest.
OVSDB_PROBE_MS = 30_000


def manager_commands(target: str) -> list[str]:
    """ovs-vsctl arguments that make `target` (ptcp:/pssl:6640:<management ip>) the node's OVSDB
    manager, with our inactivity probe."""
    return ["set-manager", target, "--", "set", "Manager", target, f"inactivity_probe={OVSDB_PROBE_MS}"]


@dataclass(frozen=True)
class Transport:
    scheme: str                 # "ssl" or "tcp", as OVS spells its targets
    files: Files | None = None  # the controller's key, certificate and the switch CA bundle (TLS)

    @property
    def tls(self) -> bool:
        return self.scheme == "ssl"


_current = Transport("tcp")


def import_ovs() -> None:
    """Import python-ovs's poller without eventlet. It imports eventlet, when installed (os-ken
    depends on it), only to tell whether `select` is monkey-patched; nothing in fathom runs
    eventlet, and its import alone (its DNS resolver) holds some 30 MB of a process's memory. A
    later `import eventlet` elsewhere still works."""
    if "ovs.poller" in sys.modules or "eventlet" in sys.modules:
        return
    sys.modules["eventlet"] = None      # None in sys.modules: the import raises ImportError
    try:
        import ovs.poller  # noqa: F401
    finally:
        del sys.modules["eventlet"]


def use_tls(pki_dir: str) -> Transport:
    """TLS on both channels with the controller certificate of the PKI in pki_dir."""
    global _current
    import_ovs()
    from ovs.stream import Stream
    files = Pki(pki_dir).files(CONTROLLER_NAME)
    for f in (files.key, files.cert, files.trust):
        if not f.exists():
            raise FileNotFoundError(f"{f} is missing: is {pki_dir} a fathom PKI (fathom pki init)?")
    Stream.ssl_set_private_key_file(str(files.key))
    Stream.ssl_set_certificate_file(str(files.cert))
    Stream.ssl_set_ca_cert_file(str(files.trust))
    _current = Transport("ssl", files)
    return _current


def use_plain_tcp() -> Transport:
    global _current
    _current = Transport("tcp")
    return _current


def current() -> Transport:
    return _current


def ovsdb_remote(management_ip: str) -> str:
    """The OVSDB target of a node or fabric switch, e.g. ssl:198.18.128.10:6640."""
    return f"{_current.scheme}:{management_ip}:{OVSDB_PORT}"


def controller_target(local_ip: str, of_port: int) -> str:
    """What a bridge's Controller row says, e.g. ssl:198.18.128.1:6653."""
    return f"{_current.scheme}:{local_ip}:{of_port}"


def server_context(files: Files) -> ssl.SSLContext:
    """The OpenFlow listener's TLS: TLS 1.2 or later, a certificate from the switch CA required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(files.cert), str(files.key))
    ctx.load_verify_locations(str(files.trust))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

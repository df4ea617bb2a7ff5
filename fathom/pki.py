"""The certificate authority fathom manages for its control channels (OpenFlow and OVSDB over TLS).

Two CAs, as OVS's own `ovs-pki` has: the *controller CA* signs only the controller's certificate and
is what every switch trusts, the *switch CA* signs one certificate per node or fabric switch and is
what the controller trusts. A node's key therefore cannot pass for the controller toward another
node's OVSDB or switch.

A certificate names what holds it: subject CN = the node's (or switch's) name, OU = its kind (node,
switch, controller). Where the datapath ids are known (a registered node) they are bound into the
certificate as URIs `urn:fathom:dpid:<16 hex digits>` in the subject alternative names; the
controller then accepts exactly those datapath ids from that certificate.

Layout of a PKI directory (the directory 0700, private keys 0600, everything owned by root):
    controllerca/cacert.pem   the current CA certificate     controllerca/cakey.pem  its key
    controllerca/trust.pem    every CA certificate peers accept (current, plus the previous one
                              during a CA rotation)
    switchca/...              the same for the switch CA
    certs/<name>.pem          a holder's certificate          private/<name>.key      its key
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KINDS = ("node", "switch", "controller")
CONTROLLER_NAME = "controller"
DPID_URI = "urn:fathom:dpid:"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
CA_DAYS = 3650
LEAF_DAYS = 365


class PkiError(RuntimeError):
    pass


@dataclass(frozen=True)
class Identity:
    """Who a certificate names: kind, name and the datapath ids bound to it (empty: none bound)."""
    kind: str
    name: str
    dpids: frozenset[int] = frozenset()


def identity_of(cert: x509.Certificate | bytes) -> Identity:
    """The identity a certificate (object or DER bytes) names; PkiError if it names none."""
    if isinstance(cert, (bytes, bytearray)):
        cert = x509.load_der_x509_certificate(bytes(cert))
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(cn) != 1 or len(ou) != 1 or ou[0].value not in KINDS:
        raise PkiError(f"certificate subject {cert.subject.rfc4514_string()!r} names no fathom node or switch")
    dpids = set()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(DPID_URI):
                dpids.add(int(uri[len(DPID_URI):], 16))
    except x509.ExtensionNotFound:
        pass
    return Identity(ou[0].value, cn[0].value, frozenset(dpids))


def _check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise PkiError(f"invalid name {name!r}: 1-63 characters a-z 0-9 . _ -, starting with a letter or digit")


def _write(path: Path, data: bytes, mode: int) -> None:
    """Atomically, created with its final mode (a key is never readable by others, not even briefly)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    tmp.replace(path)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Files:
    """What one holder needs: its key and certificate, and the CAs it accepts from its peers."""
    key: Path
    cert: Path
    trust: Path


class Pki:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    # ------------------------------------------------------------------------ layout
    def ca_dir(self, ca: str) -> Path:
        if ca not in ("controller", "switch"):
            raise PkiError(f"no CA {ca!r}: controller or switch")
        return self.dir / f"{ca}ca"

    @staticmethod
    def ca_for(kind: str) -> str:
        return "controller" if kind == "controller" else "switch"

    def cert_path(self, name: str) -> Path:
        return self.dir / "certs" / f"{name}.pem"

    def key_path(self, name: str) -> Path:
        return self.dir / "private" / f"{name}.key"

    def files(self, name: str) -> Files:
        """A holder's key, certificate, and the trust bundle of the *other* CA (the peers' issuer)."""
        cert = self.cert_path(name)
        if not cert.exists():
            raise PkiError(f"no certificate for {name!r} in {self.dir} (fathom pki issue {name} ...)")
        kind = identity_of(x509.load_pem_x509_certificate(cert.read_bytes())).kind
        peer_ca = "switch" if kind == "controller" else "controller"
        return Files(self.key_path(name), cert, self.ca_dir(peer_ca) / "trust.pem")

    def initialised(self) -> bool:
        return all((self.ca_dir(ca) / f).exists() for ca in ("controller", "switch")
                   for f in ("cacert.pem", "cakey.pem", "trust.pem"))

    # ------------------------------------------------------------------------ CAs
    def init(self) -> bool:
        """Create both CAs and the controller's certificate; False if they already exist (kept)."""
        if self.initialised():
            return False
        if self.dir.exists() and any(self.dir.iterdir()):
            raise PkiError(f"{self.dir} exists and is not a complete fathom PKI: refusing to overwrite it")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for ca in ("controller", "switch"):
            self._new_ca(ca, keep_previous=False)
        self.issue(CONTROLLER_NAME, "controller")
        return True

    def _new_ca(self, ca: str, keep_previous: bool) -> x509.Certificate:
        key = ec.generate_private_key(ec.SECP256R1())
        serial = x509.random_serial_number()
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fathom"),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"fathom {ca} CA {serial & 0xFFFFFFFF:08x}")])
        now = dt.datetime.now(dt.timezone.utc)
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(serial).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(ski, critical=False)
                .sign(key, hashes.SHA256()))
        d = self.ca_dir(ca)
        previous = (d / "cacert.pem").read_bytes() if keep_previous and (d / "cacert.pem").exists() else b""
        _write(d / "cakey.pem", _key_pem(key), 0o600)
        _write(d / "cacert.pem", _cert_pem(cert), 0o644)
        _write(d / "trust.pem", _cert_pem(cert) + previous, 0o644)
        return cert

    def _ca(self, ca: str):
        d = self.ca_dir(ca)
        if not (d / "cakey.pem").exists():
            raise PkiError(f"no PKI in {self.dir}: run 'fathom pki init --dir {self.dir}' first")
        key = serialization.load_pem_private_key((d / "cakey.pem").read_bytes(), password=None)
        return key, x509.load_pem_x509_certificate((d / "cacert.pem").read_bytes())

    # ------------------------------------------------------------------------ leaves
    def issue(self, name: str, kind: str = "node", dpids=(), days: int = LEAF_DAYS) -> Files:
        """A new key and certificate for `name` (replacing any previous one)."""
        _check_name(name)
        if kind not in KINDS:
            raise PkiError(f"invalid kind {kind!r}: one of {', '.join(KINDS)}")
        if (kind == "controller") != (name == CONTROLLER_NAME):
            raise PkiError(f"the name {CONTROLLER_NAME!r} is the controller's and only the controller's")
        dpids = sorted({int(d) for d in dpids})
        if any(not 0 < d < 1 << 64 for d in dpids):
            raise PkiError("a datapath id is a 64-bit number greater than 0")
        ca_key, ca_cert = self._ca(self.ca_for(kind))
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        sans = [x509.UniformResourceIdentifier(f"urn:fathom:{kind}:{name}")]
        sans += [x509.UniformResourceIdentifier(f"{DPID_URI}{d:016x}") for d in dpids]
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fathom"),
                                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                                         x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=True,
                                             key_cert_sign=False, crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                # both ends of each channel: a node serves OVSDB and is an OpenFlow client, the
                # controller the reverse
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write(self.key_path(name), _key_pem(key), 0o600)
        _write(self.cert_path(name), _cert_pem(cert), 0o644)
        return self.files(name)

    def load(self, name: str) -> x509.Certificate:
        path = self.cert_path(name)
        if not path.exists():
            raise PkiError(f"no certificate for {name!r} in {self.dir}")
        return x509.load_pem_x509_certificate(path.read_bytes())

    def rotate(self, name: str, days: int = LEAF_DAYS) -> Files:
        """A new key and certificate for `name`, same subject and datapath ids, from the current CA."""
        ident = identity_of(self.load(name))
        return self.issue(name, ident.kind, ident.dpids, days)

    def rotate_ca(self, ca: str) -> list[str]:
        """Start a CA rotation: a new CA (trusted next to the old one) re-issues all its holders."""
        self._ca(ca)
        self._new_ca(ca, keep_previous=True)
        names = [c["name"] for c in self.list() if self.ca_for(c["kind"]) == ca]
        for name in names:
            self.rotate(name)
        return names

    def finish_ca_rotation(self, ca: str) -> None:
        """End a CA rotation: peers stop accepting certificates from the previous CA."""
        d = self.ca_dir(ca)
        self._ca(ca)
        _write(d / "trust.pem", (d / "cacert.pem").read_bytes(), 0o644)

    def list(self) -> list[dict]:
        out = []
        for path in sorted((self.dir / "certs").glob("*.pem")):
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            ident = identity_of(cert)
            out.append({"name": ident.name, "kind": ident.kind, "serial": f"{cert.serial_number:x}",
                        "not_after": cert.not_valid_after_utc.isoformat(),
                        "issuer": cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
                        "dpids": [f"{d:016x}" for d in sorted(ident.dpids)],
                        "cert": str(path), "key": str(self.key_path(ident.name))})
        return out

    def verify(self, name: str) -> None:
        """PkiError unless `name`'s certificate was signed by a CA its peers trust and is in date."""
        cert = self.load(name)
        ca = self.ca_for(identity_of(cert).kind)
        trusted = x509.load_pem_x509_certificates((self.ca_dir(ca) / "trust.pem").read_bytes())
        now = dt.datetime.now(dt.timezone.utc)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise PkiError(f"certificate of {name!r} is not valid now")
        for ca_cert in trusted:
            try:
                cert.verify_directly_issued_by(ca_cert)
                return
            except (ValueError, TypeError, InvalidSignature):  # another CA, or not its signature
                continue
        raise PkiError(f"certificate of {name!r} is not signed by a trusted {ca} CA")

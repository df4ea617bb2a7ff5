"""fathom.pki: two CAs, certificates naming their holder and binding datapath ids, root-only files,
rotation of keys and of CAs; checked with real TLS handshakes (Python's ssl, OpenSSL underneath)."""
import json
import socket
import ssl
import stat
import threading

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec

from fathom.cli.main import cli
from fathom.controller.channels import server_context
from fathom.pki import CONTROLLER_NAME, Identity, Pki, PkiError, identity_of


@pytest.fixture
def pki(tmp_path):
    p = Pki(tmp_path / "pki")
    assert p.init()
    return p


def handshake(server_ctx: ssl.SSLContext, key, cert, trust) -> tuple[bool, str]:
    """A real TLS handshake over a socket pair: the controller's listener context against a client
    holding (key, cert) and trusting `trust`. (accepted, error text)."""
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.load_cert_chain(str(cert), str(key))
    client_ctx.load_verify_locations(str(trust))
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    result = {}

    def serve():
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                result["peer"] = identity_of(s.getpeercert(binary_form=True))
                s.sendall(b"ok")
        except (ssl.SSLError, OSError) as e:
            result["error"] = str(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(b) as c:
            c.recv(2)
    except (ssl.SSLError, OSError) as e:
        result.setdefault("error", str(e))
    t.join(5)
    return "error" not in result, result.get("error", "") or result.get("peer")


def test_init_makes_two_cas_and_the_controller_certificate_root_only(pki):
    assert not pki.init()   # a second init keeps what is there
    for ca in ("controller", "switch"):
        d = pki.ca_dir(ca)
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "cakey.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(pki.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(pki.key_path(CONTROLLER_NAME).stat().st_mode) == 0o600
    assert identity_of(pki.load(CONTROLLER_NAME)) == Identity("controller", CONTROLLER_NAME)
    pki.verify(CONTROLLER_NAME)


def test_init_refuses_a_directory_that_is_not_a_pki(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "something").write_text("keep me")
    with pytest.raises(PkiError, match="not a complete fathom PKI"):
        Pki(tmp_path / "x").init()
    assert (tmp_path / "x" / "something").read_text() == "keep me"


def test_a_node_certificate_names_the_node_and_binds_its_datapath_ids(pki):
    files = pki.issue("compute1", "node", [0xFA00_0000_0000_0001, 0xFC00_0000_0000_0001])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert identity_of(cert) == Identity("node", "compute1", frozenset({0xFA00_0000_0000_0001, 0xFC00_0000_0000_0001}))
    assert cert.subject.rfc4514_string() == "CN=compute1,OU=node,O=fathom"
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    # the node trusts the controller CA; the controller trusts the switch CA
    assert files.trust == pki.ca_dir("controller") / "trust.pem"
    assert pki.files(CONTROLLER_NAME).trust == pki.ca_dir("switch") / "trust.pem"
    # signed by the switch CA, not by the controller CA
    switch_ca = x509.load_pem_x509_certificate((pki.ca_dir("switch") / "cacert.pem").read_bytes())
    controller_ca = x509.load_pem_x509_certificate((pki.ca_dir("controller") / "cacert.pem").read_bytes())
    cert.verify_directly_issued_by(switch_ca)
    with pytest.raises((ValueError, InvalidSignature)):
        cert.verify_directly_issued_by(controller_ca)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


@pytest.mark.parametrize("name,kind,dpids,message", [
    ("Compute1", "node", [], "invalid name"),
    ("../etc", "node", [], "invalid name"),
    ("x" * 64, "node", [], "invalid name"),
    ("c1", "router", [], "invalid kind"),
    ("controller", "node", [], "only the controller's"),
    ("c1", "controller", [], "only the controller's"),
    ("c1", "node", [0], "64-bit"),
    ("c1", "node", [1 << 64], "64-bit"),
])
def test_issue_rejects(pki, name, kind, dpids, message):
    with pytest.raises(PkiError, match=message):
        pki.issue(name, kind, dpids)


def test_a_certificate_without_a_fathom_subject_names_no_one(pki, tmp_path):
    other = Pki(tmp_path / "o")
    other.init()
    ca = x509.load_pem_x509_certificate((other.ca_dir("switch") / "cacert.pem").read_bytes())
    with pytest.raises(PkiError, match="names no fathom node"):
        identity_of(ca)


def test_the_controller_listener_accepts_only_switch_ca_certificates(pki, tmp_path):
    server = server_context(pki.files(CONTROLLER_NAME))
    node = pki.issue("compute1", "node", [0xFA00_0000_0000_0001])
    ok, peer = handshake(server, node.key, node.cert, node.trust)
    assert ok and peer == Identity("node", "compute1", frozenset({0xFA00_0000_0000_0001}))
    # the controller's own certificate is from the controller CA: no switch can use it
    ctl = pki.files(CONTROLLER_NAME)
    ok, error = handshake(server, ctl.key, ctl.cert, node.trust)
    assert not ok
    # a certificate naming compute1 from another PKI
    other = Pki(tmp_path / "other")
    other.init()
    forged = other.issue("compute1", "node", [0xFA00_0000_0000_0001])
    ok, error = handshake(server, forged.key, forged.cert, node.trust)
    assert not ok


def test_rotate_gives_a_new_key_with_the_same_identity(pki):
    before = pki.issue("compute1", "node", [7])
    old_cert = pki.load("compute1")
    old_key = before.key.read_bytes()
    pki.rotate("compute1")
    new_cert = pki.load("compute1")
    assert identity_of(new_cert) == identity_of(old_cert)
    assert new_cert.serial_number != old_cert.serial_number
    assert before.key.read_bytes() != old_key
    assert new_cert.public_key().public_numbers() != old_cert.public_key().public_numbers()


def test_ca_rotation_trusts_both_cas_until_finished(pki):
    server_old = server_context(pki.files(CONTROLLER_NAME))
    node = pki.issue("compute1", "node")
    old_key, old_cert = node.key.read_bytes(), node.cert.read_bytes()
    keep = pki.dir / "old"
    keep.mkdir()
    (keep / "k").write_bytes(old_key)
    (keep / "c").write_bytes(old_cert)

    assert pki.rotate_ca("switch") == ["compute1"]
    assert len(x509.load_pem_x509_certificates((pki.ca_dir("switch") / "trust.pem").read_bytes())) == 2
    pki.verify("compute1")
    assert pki.load("compute1").issuer != x509.load_pem_x509_certificate(old_cert).issuer
    # during the rotation the controller (new trust bundle) accepts the old and the new certificate
    server = server_context(pki.files(CONTROLLER_NAME))
    assert handshake(server, keep / "k", keep / "c", node.trust)[0]
    assert handshake(server, node.key, node.cert, node.trust)[0]
    # a controller still on the old bundle does not know the new CA yet
    assert not handshake(server_old, node.key, node.cert, node.trust)[0]

    pki.finish_ca_rotation("switch")
    server = server_context(pki.files(CONTROLLER_NAME))
    assert not handshake(server, keep / "k", keep / "c", node.trust)[0]
    assert handshake(server, node.key, node.cert, node.trust)[0]


def test_cli_init_issue_list_rotate(tmp_path):
    d = str(tmp_path / "pki")
    run = lambda *a: CliRunner().invoke(cli, list(a), catch_exceptions=False)  # noqa: E731
    assert run("pki", "init", "--dir", d, "--json").output.count('"created": true') == 1
    out = json.loads(run("pki", "issue", "--dir", d, "c1", "--dpid", "fa00000000000001", "--json").output)
    assert out["name"] == "c1" and out["ca_cert"].endswith("controllerca/trust.pem")
    listed = {c["name"]: c for c in json.loads(run("pki", "list", "--dir", d, "--json").output)}
    assert listed["c1"]["dpids"] == ["fa00000000000001"] and listed["c1"]["kind"] == "node"
    assert listed["controller"]["kind"] == "controller"
    serial = listed["c1"]["serial"]
    assert json.loads(run("pki", "rotate", "--dir", d, "c1", "--json").output)["rotated"] == ["c1"]
    assert {c["name"]: c for c in json.loads(run("pki", "list", "--dir", d, "--json").output)}["c1"]["serial"] != serial
    bad = CliRunner().invoke(cli, ["pki", "issue", "--dir", d, "c2", "--dpid", "zz"])
    assert bad.exit_code == 2 and "not a datapath id" in bad.output
    bad = CliRunner().invoke(cli, ["pki", "issue", "--dir", str(tmp_path / "none"), "c2"])
    assert bad.exit_code == 1 and "fathom pki init" in bad.output


def test_controller_refuses_to_start_without_tls_material_unless_insecure(tmp_path):
    result = CliRunner().invoke(cli, ["controller", "--pki-dir", str(tmp_path / "none"), "--db",
                                      f"sqlite:///{tmp_path}/x.db"])
    assert result.exit_code == 2 and "--insecure" in result.output and "fathom pki init" in result.output

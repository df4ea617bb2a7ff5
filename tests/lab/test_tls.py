"""TLS on the control channels, on real OVS: a lab runs OpenFlow and OVSDB over TLS by default; a
rogue connection claiming a node's datapath id (plain TCP, a certificate from another CA, another
node's certificate, the node's own stolen certificate) is refused and never sees the flow table,
while the real switch's session and the VMs' traffic carry on; tcpdump on the management network
sees TLS records, not OpenFlow. An --insecure lab is the control: there tcpdump does see OpenFlow,
and a plain connection claiming a live datapath id is still refused."""
import json
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fathom.host import exec as host_exec
from fathom.lab.capture import Capture, tshark
from fathom.lab.lab import install_certificate
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from fathom.pki import Pki, identity_of

from .util import running_lab, sh, lab_api as api

ROGUE = str(Path(__file__).with_name("rogue_switch.py"))
VM1_MAC = bytes.fromhex("02fa00000101")
TWO_NODES = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1001, cidr: 198.19.1.0/24}
nodes:
  - name: compute1
    vms: [{name: vm1, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}]
  - name: compute2
    vms: [{name: vm3, mac: "02:fa:00:00:01:03", ip: 198.19.1.13/24, network: blue}]
"""
# OpenFlow messages a refused connection may have seen: hello, echo request, features request
HANDSHAKE_ONLY = {0, 2, 5}


@pytest.fixture(scope="module")
def lab():
    with running_lab("tlt", standalone=False) as lab:
        yield lab


def controller_log(lab) -> str:
    return (lab.dir / "controller.log").read_text(errors="replace")


def node_id(lab, name: str) -> int:
    return lab.state()["controller"]["created"]["nodes"][name]


def rogue(lab, dpid: int, seconds: float = 4, tls: tuple[str, str, str] | None = None, where: str = "compute2") -> dict:
    """The rogue switch, run from a node's namespace toward the lab's controller."""
    c = lab.state()["controller"]
    args = [sys.executable, ROGUE, c["of_host"], str(c["of_port"]), f"{dpid:016x}", str(seconds), *(tls or ())]
    out = sh(lab, where, *args, timeout=seconds + 20).stdout
    return json.loads(out.strip().splitlines()[-1])


class Pinger:
    """A ping running through a rogue's attempt: it must not lose a packet."""

    def __init__(self, lab, src: str, dst: str, seconds: float):
        self.proc = subprocess.Popen(host_exec.argv(["ping", "-c", str(int(seconds * 10)),
                                      "-i", "0.1", "-W", "1", dst], lab.ns(src)), stdout=subprocess.PIPE, text=True)

    def loss(self) -> str:
        out = self.proc.communicate(timeout=60)[0]
        return next(line for line in out.splitlines() if "packet loss" in line)


class OpenFlowCapture:
    """tcpdump on the management bridge (both directions of the OpenFlow port) while `action` runs,
    read back with tshark."""

    def __init__(self, lab, action, seconds_after: float = 1.0):
        self.port = lab.state()["controller"]["of_port"]
        self.pcap = lab.dir / "of.pcap"
        with Capture(None, lab.state()["management"]["bridge"], self.pcap, f"tcp port {self.port}"):
            action()
            time.sleep(seconds_after)

    def tshark(self, decode_as: str, field: str, display: str = "", *more: str) -> list[str]:
        """One line per frame `display` shows: `field` (and the `more` fields, tab-separated)."""
        fields = [arg for f in (field, *more) for arg in ("-e", f)]
        return tshark(self.pcap, "-d", f"tcp.port=={self.port},{decode_as}", "-T", "fields", *fields,
                      *(["-Y", display] if display else []))

    def payloads(self) -> list[bytes]:
        return [bytes.fromhex(x.replace(":", "")) for x in self.tshark("tls", "tcp.payload")]

    def openflow_messages(self) -> list[str]:
        """OpenFlow 1.3/1.4 message types tshark finds when told the port carries OpenFlow."""
        return (self.tshark("openflow", "openflow_v5.type", "openflow_v5")
                + self.tshark("openflow", "openflow_v4.type", "openflow_v4"))

    def clear_openflow_segments(self) -> list[str]:
        """TCP segments that tshark, told the port carries OpenFlow, reads as whole OpenFlow 1.3/1.4
        messages: their lengths add up to the segment's payload. Ciphertext read as OpenFlow yields
        a message now and then (a byte that reads as the version, then anything); that its length
        field also matches the segment is a chance of one in 65,536."""
        out = []
        for version in ("openflow_v4", "openflow_v5"):
            for line in self.tshark("openflow", "tcp.len", version, f"{version}.length", f"{version}.type"):
                size, lengths, types = (line.split("\t") + ["", ""])[:3]
                if lengths and sum(int(x) for x in lengths.split(",")) == int(size):
                    out.append(types)
        return out

    def tls_records(self) -> list[str]:
        return self.tshark("tls", "tls.record.content_type", "tls.record")


# ------------------------------------------------------------------------------- TLS lab

def test_tls_is_the_default_and_traffic_flows(lab):
    assert lab.state()["tls"]
    for node in ("compute1", "compute2", "gw"):
        assert sh(lab, node, "ovs-vsctl", "get-manager").stdout.strip().startswith("pssl:6640:")
        for bridge in ("br-int", "br-phy"):
            assert sh(lab, node, "ovs-vsctl", "get-controller", bridge).stdout.strip().startswith("ssl:")

        def connected(node=node):  # OVS writes is_connected back to its database every few seconds
            out = sh(lab, node, "ovs-vsctl", "--columns=is_connected", "--format=json", "list", "controller").stdout
            return all(row == [True] for row in json.loads(out)["data"])
        wait_for(connected, 15, f"{node}'s bridges to report their TLS controller connected")
    assert sh(lab, "fabric", "ovs-vsctl", "get-controller", "br-fabric").stdout.strip().startswith("ssl:")
    c = api(lab)
    assert all(n["status"] == "active" for n in c.get("/nodes").json())
    assert sh(lab, "vm1", "ping", "-c", "3", "-i", "0.2", "-W", "1", "198.19.1.13", check=False).returncode == 0


def test_keys_are_root_only(lab):
    pki = Path(lab.state()["tls"]["pki_dir"])
    for d in [pki, *(p for p in pki.iterdir() if p.is_dir()), lab.dir / "compute1" / "pki"]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for key in [*pki.glob("*/*.key"), *pki.glob("*/cakey.pem"), lab.dir / "compute1" / "pki" / "privkey.pem"]:
        st = key.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, key
    # each node holds only its own key, and its certificate binds its datapath ids
    assert sorted(p.name for p in (lab.dir / "compute1" / "pki").iterdir()) == ["cacert.pem", "cert.pem",
                                                                             "privkey.pem"]
    listed = {c["name"]: c for c in Pki(pki).list()}
    assert f"{datapath_id(node_id(lab, 'compute1')):016x}" in listed["compute1"]["dpids"]


def test_openflow_channel_is_encrypted(lab):
    # a full pass reads every switch's flows back: in the clear these replies carry every VM's MAC
    cap = OpenFlowCapture(lab, lambda: api(lab).post("/sync").raise_for_status())
    payloads = cap.payloads()
    assert len(payloads) > 20
    # tshark finds TLS application data records, and no OpenFlow message even when told to look
    content_types = [t for line in cap.tls_records() for t in line.split(",")]
    assert content_types.count("23") > 10
    assert cap.clear_openflow_segments() == []
    assert VM1_MAC not in b"".join(payloads)    # the segments joined: a MAC may straddle two


@pytest.mark.parametrize("case", ["plain-tcp", "other-ca", "other-node-cert", "own-cert-stolen"])
def test_rogue_claiming_a_node_datapath_id_is_refused(lab, tmp_path, case):
    dpid = datapath_id(node_id(lab, "compute1"))
    pki = Pki(lab.state()["tls"]["pki_dir"])
    trust = str(pki.files("compute1").trust)
    if case == "plain-tcp":
        tls = None
    elif case == "other-ca":
        # a certificate naming compute1 and binding its datapath id, but from a CA of its own
        other = Pki(tmp_path / "other")
        other.init()
        f = other.issue("compute1", "node", [dpid])
        tls = (str(f.key), str(f.cert), trust)
    elif case == "other-node-cert":
        f = pki.files("compute2")
        tls = (str(f.key), str(f.cert), trust)
    else:
        f = pki.files("compute1")
        tls = (str(f.key), str(f.cert), trust)
    sessions_before = controller_log(lab).count(f"switch {dpid:016x} connected")
    refusals_before = controller_log(lab).count("refused OpenFlow connection")
    pinger = Pinger(lab, "vm1", "198.19.1.13", 5)
    report = rogue(lab, dpid, seconds=4, tls=tls)
    sync = api(lab).post("/sync").json()
    assert " 0% packet loss" in pinger.loss()

    # refused, and never sent anything beyond the handshake: no flow reads, no bundles
    assert report["closed_by_controller"], report
    assert set(report["received"]) <= HANDSHAKE_ONLY, report
    if case in ("plain-tcp", "other-ca"):
        assert not report["features_sent"], report       # turned away in the TLS handshake
    assert controller_log(lab).count("refused OpenFlow connection") == refusals_before + 1
    # the real switch kept its session: no reconnect, node and ports active, the pass applied cleanly
    assert controller_log(lab).count(f"switch {dpid:016x} connected") == sessions_before
    assert sync["compute1"]["switch"] == "ok", sync
    c = api(lab)
    assert {n["name"]: n["status"] for n in c.get("/nodes").json()}["compute1"] == "active"
    assert all(p["status"] == "active" for p in c.get("/ports").json())
    assert f"{dpid:016x}" in c.get("/health").json()["switches"]


def test_the_fabric_switch_cannot_be_claimed_with_a_node_certificate(lab):
    from fathom.model import datapath_id_fabric
    tor = datapath_id_fabric(lab.state()["controller"]["created"]["fabric_switches"]["fabric"])
    f = Pki(lab.state()["tls"]["pki_dir"]).files("compute2")
    report = rogue(lab, tor, seconds=3, tls=(str(f.key), str(f.cert), str(f.trust)))
    assert report["closed_by_controller"] and set(report["received"]) <= HANDSHAKE_ONLY, report
    assert "is not one the controller expects of node 'compute2'" in controller_log(lab)


def test_a_node_key_rotation_takes_effect_without_loss(lab):
    """The documented procedure: a new key and certificate, installed with set-ssl; bridge/reconnect
    makes the bridges reconnect with it while traffic flows on."""
    pki = Pki(lab.state()["tls"]["pki_dir"])
    old_serial = f"{pki.load('compute1').serial_number:x}"
    node = lab.node("compute1")
    install_certificate(pki, "compute1", "node", identity_of(pki.load("compute1")).dpids, lab.ovs("compute1"),
                        node.mgmt_ip)
    new_serial = f"{pki.load('compute1').serial_number:x}"
    assert new_serial != old_serial
    pinger = Pinger(lab, "vm1", "198.19.1.13", 6)
    sh(lab, "compute1", "ovs-appctl", "-t", "ovs-vswitchd", "bridge/reconnect")
    dpid = datapath_id(node_id(lab, "compute1"))
    wait_for(lambda: f"as datapath {dpid:016x}: node 'compute1', certificate serial {new_serial}"
             in controller_log(lab), 20, "br-int to reconnect with the new certificate")
    assert " 0% packet loss" in pinger.loss()
    assert api(lab).post("/sync").json()["compute1"]["switch"] == "ok"


def test_a_switch_back_with_empty_tables_is_admitted_at_once_and_made_whole(lab):
    """A node's connections cut and its br-int's flows gone, as after ovs-vswitchd restarts: when OVS
    reconnects, its old sessions are already seen closed (admitted without probing them) and br-int
    gets every flow back; nothing the controller logs meanwhile is an ERROR."""
    ovs, dpid = lab.ovs("compute1"), datapath_id(node_id(lab, "compute1"))
    port = lab.state()["controller"]["of_port"]

    def flow_count() -> int:
        return int(re.search(r"flow_count=(\d+)", ovs.ofctl("dump-aggregate", "br-int")).group(1))
    installed, logged = flow_count(), len(controller_log(lab))
    ovs.ofctl("del-flows", "br-int")
    cut = sh(lab, "compute1", "ss", "-K", "-tnH", "state", "established", f"( dport = :{port} )").stdout
    assert len(cut.splitlines()) == 2, cut          # br-int's and br-phy's
    wait_for(lambda: flow_count() == installed, 30, "compute1's br-int to hold every flow again")
    new = controller_log(lab)[logged:]
    assert f"switch {dpid:016x} disconnected" in new and f"switch {dpid:016x} connected" in new, new
    assert "failed its echo" not in new, new
    assert " ERROR " not in new, new
    assert api(lab).post("/sync").json()["compute1"]["switch"] == "ok"


# ------------------------------------------------------------------------------- the control

def test_insecure_lab_is_plain_openflow_and_still_keeps_the_live_session():
    with running_lab("tli", TWO_NODES, standalone=False, insecure=True) as lab:
        assert lab.state()["tls"] is None
        assert sh(lab, "compute1", "ovs-vsctl", "get-controller", "br-int").stdout.strip().startswith("tcp:")
        cap = OpenFlowCapture(lab, lambda: api(lab).post("/sync").raise_for_status())
        # the same witness sees OpenFlow in the clear: messages, and the VMs' MACs in the flow table
        assert len(cap.openflow_messages()) > 10 and len(cap.clear_openflow_segments()) > 10
        assert cap.tls_records() == []
        assert VM1_MAC in b"".join(cap.payloads())    # the segments joined: a MAC may straddle two
        # the original attack: a plain connection claiming compute1's live datapath id
        dpid = datapath_id(node_id(lab, "compute1"))
        pinger = Pinger(lab, "vm1", "198.19.1.13", 4)
        report = rogue(lab, dpid, seconds=3)
        assert " 0% packet loss" in pinger.loss()
        assert report["features_sent"] and report["closed_by_controller"], report
        assert set(report["received"]) <= HANDSHAKE_ONLY, report
        assert "is held by a live session" in controller_log(lab)
        assert api(lab).post("/sync").json()["compute1"]["switch"] == "ok"
        # an id the controller does not expect of any switch is refused too
        report = rogue(lab, 0x1234, seconds=2)
        assert report["closed_by_controller"] and set(report["received"]) <= HANDSHAKE_ONLY, report
        assert "0000000000001234 is not one the controller expects" in controller_log(lab)

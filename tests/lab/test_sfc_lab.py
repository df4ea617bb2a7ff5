"""Service chains on real OVS: one lab under its controller (fathom/lab/topologies/sfc.yaml), VNFs
that do real work (nft firewall, nDPI, IP forwarder, NAT, HAProxy; fathom/lab/vnf.py), chains made
through the API, nginx on the server and curl on the client. Witnesses: tcpdump on both ports of
every VNF and on the server, read with scapy; the server's bytes; ping for unrelated traffic.

compute1: client, other, fw1; compute2: fw2, dpi; compute3: server, fwd, nat, proxy.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from scapy.all import IP, TCP, rdpcap

from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab import vnf as vnfs
from fathom.lab.capture import Capture
from fathom.lab.topology import DEFAULT_TOPOLOGY

from .util import admit_web_from, live_watchers_end, running_lab, sh

TOPOLOGY = (DEFAULT_TOPOLOGY.parent / "sfc.yaml").read_text()
SERVER, CLIENT = "198.19.20.21", "198.19.20.11"
VNFS = ("fw1", "fw2", "dpi", "fwd", "nat", "proxy")
EGRESS_IP = {"nat": "198.19.20.110", "proxy": "198.19.20.112"}
BLOB = 300_000


@pytest.fixture(scope="module")
def lab():
    with running_lab("sfl", TOPOLOGY, standalone=False) as lab:
        www = lab.dir / "www"
        www.mkdir()
        (www / "blob").write_bytes(hashlib.shake_256(b"fathom sfc").digest(BLOB))
        vnfs.start_web(lab.ns("server"), lab.dir / "server-web", www)
        yield lab


@pytest.fixture(scope="module")
def api(lab):
    """The lab's controller; the server's security group (its project's default: ingress only from
    members) also admits the web traffic of the NAT and the proxy, whose VNF ports have no groups."""
    client = Client.for_lab(lab.state())
    admit_web_from(client, EGRESS_IP.values())
    yield client
    client.close()


def ids(lab) -> dict:
    return lab.state()["controller"]["created"]


@contextlib.contextmanager
def chain(api, lab, groups: list[list[str]], symmetric=False, classifiers=({"protocol": "tcp", "port": 80},)):
    """A port chain through groups of the lab's VNFs (by name), classifying client -> server; all of
    it deleted afterwards."""
    made = []
    try:
        gids = []
        for members in groups:
            g = api.post("/sfc/port_pair_groups", json={"port_pairs": [ids(lab)["port_pairs"][v] for v in members],
                                                          "project_id": "demo"})
            made.append(f"/sfc/port_pair_groups/{g['id']}")
            gids.append(g["id"])
        fcs = []
        for c in classifiers:
            ports = {"destination_port_range_min": c["port"], "destination_port_range_max": c["port"]} if "port" in c else {}
            fc = api.post("/sfc/flow_classifiers", json={
                "protocol": c["protocol"], **ports,
                "logical_source_port": ids(lab)["ports"]["client"], "logical_destination_port": ids(lab)["ports"]["server"],
                "project_id": "demo"})
            made.append(f"/sfc/flow_classifiers/{fc['id']}")
            fcs.append(fc["id"])
        ch = api.post("/sfc/port_chains", json={"port_pair_groups": gids, "flow_classifiers": fcs, "project_id": "demo",
                                                  "chain_parameters": {"symmetric": symmetric}})
        made.append(f"/sfc/port_chains/{ch['id']}")
        api.wait_status("sfc/port_chains", ch["id"], timeout=20)
        yield ch
    finally:
        for path in reversed(made):
            api.delete(path)


@contextlib.contextmanager
def captures(lab, tmp_path, bpf="tcp"):
    """tcpdump on eth0 and eth1 of every VNF and on the server; yields {(target, dev): pcap path} (in a
    directory of their own: files are read once, by path)."""
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    targets = [(v, d) for v in VNFS for d in ("eth0", "eth1")] + [("server", "eth0")]
    with contextlib.ExitStack() as stack:
        caps = {(target, dev): stack.enter_context(Capture(lab.ns(target), dev, tmp_path / f"{target}-{dev}.pcap", bpf))
                for target, dev in targets}
        yield {key: cap.path for key, cap in caps.items()}


@functools.lru_cache(maxsize=64)
def tcp_packets(path: Path) -> list:
    """The TCP packets of a finished capture (read once: the checks look at each file many times)."""
    return [p for p in rdpcap(str(path)) if IP in p and TCP in p]


def syn_time(paths, target, dev, sport: int) -> float | None:
    """When the SYN of the client's flow from `sport` passed (first one), or None."""
    for p in tcp_packets(paths[(target, dev)]):
        if p[TCP].sport == sport and p[TCP].flags & 0x02 and not p[TCP].flags & 0x10:
            return float(p.time)
    return None


def seen(paths, target, dev, sport: int) -> list:
    """Packets of the client's flow from `sport` (both directions) at (target, dev)."""
    return [p for p in tcp_packets(paths[(target, dev)]) if sport in (p[TCP].sport, p[TCP].dport)]


def curl_sha(lab, sport: int) -> str:
    proc = subprocess.run(host_exec.argv(["curl", "-s", "--fail", "--max-time", "10",
                           "--local-port", str(sport), f"http://{SERVER}/blob"], lab.ns("client")), capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return hashlib.sha256(proc.stdout).hexdigest()


def blob_sha(lab) -> str:
    return hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", [["fw1"], ["fw1", "dpi"], ["fw1", "dpi", "fwd"]], ids=["1-node", "2-nodes", "3-nodes"])
def test_path_and_order_across_nodes(lab, api, tmp_path, path):
    """Every VNF of the chain sees the flow, in chain order (in on eth0, out on eth1), no other VNF
    sees it, and the client gets the server's bytes unchanged."""
    sport = 41000 + len(path)
    with chain(api, lab, [[v] for v in path]):
        with captures(lab, tmp_path) as paths:
            assert curl_sha(lab, sport) == blob_sha(lab)
    times = []
    for v in path:
        times += [syn_time(paths, v, "eth0", sport), syn_time(paths, v, "eth1", sport)]
    times.append(syn_time(paths, "server", "eth0", sport))
    assert None not in times, dict(zip([f"{v}{d}" for v in path for d in ("in", "out")] + ["server"], times))
    assert times == sorted(times), times
    for other in set(VNFS) - set(path):
        assert not seen(paths, other, "eth0", sport) and not seen(paths, other, "eth1", sport), other
    # not symmetric: the replies go straight back, no VNF sees them
    for v in path:
        assert not [p for p in seen(paths, v, "eth1", sport) if p[TCP].sport == 80]


def test_load_balancing_and_symmetric_return(lab, api, tmp_path):
    """Flows spread over both firewall instances; every packet of a flow, both ways, crosses one
    instance only; the replies come back through it (in on eth1, out on eth0) and through the DPI."""
    sports = list(range(42000, 42016))
    with chain(api, lab, [["fw1", "fw2"], ["dpi"]], symmetric=True):
        with captures(lab, tmp_path) as paths:
            for sport in sports:
                assert curl_sha(lab, sport) == blob_sha(lab)
    used = {}
    for sport in sports:
        at = [v for v in ("fw1", "fw2") if seen(paths, v, "eth0", sport) or seen(paths, v, "eth1", sport)]
        assert len(at) == 1, (sport, at)
        v = at[0]
        used[sport] = v
        forward_in = [p for p in seen(paths, v, "eth0", sport) if p[TCP].dport == 80]
        back_in = [p for p in seen(paths, v, "eth1", sport) if p[TCP].sport == 80]
        back_out = [p for p in seen(paths, v, "eth0", sport) if p[TCP].sport == 80]
        assert forward_in and back_in and back_out, (sport, v)
        assert [p for p in seen(paths, "dpi", "eth1", sport) if p[TCP].sport == 80], sport   # replies via the DPI
    assert set(used.values()) == {"fw1", "fw2"}, used


def test_nat_and_the_proxy_that_terminates_tcp(lab, api, tmp_path):
    """Through the NAT the server sees the NAT's address and the client's port; through HAProxy it
    sees a connection of the proxy's own (the client's flow ends there). The bytes arrive either way."""
    with chain(api, lab, [["fw1"], ["nat"]], symmetric=True):
        with captures(lab, tmp_path) as paths:
            assert curl_sha(lab, 43001) == blob_sha(lab)
        syns = [p for p in tcp_packets(paths[("server", "eth0")]) if p[TCP].flags == "S"]
        assert [(p[IP].src, p[TCP].sport) for p in syns] == [(EGRESS_IP["nat"], 43001)]
    with chain(api, lab, [["proxy"]]):
        with captures(lab, tmp_path) as paths:
            assert curl_sha(lab, 43002) == blob_sha(lab)
        syns = [p for p in tcp_packets(paths[("server", "eth0")]) if p[TCP].flags == "S"]
        assert len(syns) == 1 and syns[0][IP].src == EGRESS_IP["proxy"] and syns[0][TCP].sport != 43002
        assert not seen(paths, "server", "eth0", 43002)


def test_server_receives_byte_identical_payload(lab, api):
    """An upload through firewall, DPI and forwarder: the server's bytes hash like the client's."""
    data = hashlib.shake_256(b"upload").digest(1_000_000)
    sink = subprocess.Popen(host_exec.argv(["python3", "-c",
                             "import hashlib,socket\n"
                             "s=socket.create_server(('0.0.0.0',9000)); c,_=s.accept(); h=hashlib.sha256()\n"
                             "while True:\n b=c.recv(65536)\n if not b: break\n h.update(b)\n"
                             "print(h.hexdigest())"], lab.ns("server")), stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    with chain(api, lab, [["fw1"], ["dpi"], ["fwd"]], classifiers=({"protocol": "tcp", "port": 9000},)):
        up = subprocess.run(host_exec.argv(["python3", "-c",
                             "import socket,sys\nc=socket.create_connection(('%s',9000)); c.sendall(sys.stdin.buffer.read());"
                             "c.shutdown(socket.SHUT_WR); c.recv(1)" % SERVER], lab.ns("client")), input=data, capture_output=True, timeout=30)
        assert up.returncode == 0, up.stderr
        out, _ = sink.communicate(timeout=30)
    assert out.strip() == hashlib.sha256(data).hexdigest()
    dpi_rx = int(sh(lab, "dpi", "cat", "/sys/class/net/eth0/statistics/rx_bytes").stdout)
    assert dpi_rx > len(data)      # the upload crossed the DPI


def test_update_and_delete_under_traffic_lose_no_unrelated_packet(lab, api):
    """Pings (not classified) from two VMs every 10 ms while a chain is created, updated in place
    twice and deleted: not one is lost. The chain's own traffic keeps flowing through its VNFs. A
    failure names the source, the echoes not answered before the next one (with their times) and
    when each step was taken."""
    sources = ("client", "other")
    pings = [subprocess.Popen(host_exec.argv(["ping", "-D", "-O", "-c", "500", "-i", "0.01",
                               "-W", "1", SERVER], lab.ns(src)), stdout=subprocess.PIPE, text=True) for src in sources]
    steps = []

    def step(what):
        steps.append(f"{time.time():.3f} {what}")
    with chain(api, lab, [["fw1"]]) as ch:
        step("chain created")
        gid = {v: api.post("/sfc/port_pair_groups", json={"port_pairs": [ids(lab)["port_pairs"][v]],
                                                           "project_id": "demo"})["id"] for v in ("dpi", "fwd")}
        try:
            assert curl_sha(lab, 44001) == blob_sha(lab)
            step("adding dpi")
            api.patch(f"/sfc/port_chains/{ch['id']}", json={"port_pair_groups": ch["port_pair_groups"] + [gid["dpi"]]})
            api.wait_status("sfc/port_chains", ch["id"], timeout=20)
            assert curl_sha(lab, 44002) == blob_sha(lab)
            step("replacing the groups by fwd")
            api.patch(f"/sfc/port_chains/{ch['id']}", json={"port_pair_groups": [gid["fwd"]]})
            api.wait_status("sfc/port_chains", ch["id"], timeout=20)
            assert curl_sha(lab, 44003) == blob_sha(lab)
            step("putting the groups back")
            api.patch(f"/sfc/port_chains/{ch['id']}", json={"port_pair_groups": ch["port_pair_groups"]})
        finally:
            for g in gid.values():
                with contextlib.suppress(Exception):
                    api.delete(f"/sfc/port_pair_groups/{g}")
        step("chain deleting")
    api.sync()
    step("synced")
    for src, p in zip(sources, pings):
        out, _ = p.communicate(timeout=30)
        late = [line for line in out.splitlines() if "no answer" in line]   # not answered before the next echo
        assert " 0% packet loss" in out, (f"{src} → server: {out.splitlines()[-2]}; not answered before the "
                                          f"next echo: {late}; steps: {steps}")


def test_dpi_inspected_what_it_forwarded(lab, api):
    """nDPI in the DPI VNF recognised the chain's web traffic it forwarded."""
    with chain(api, lab, [["dpi"]]):
        assert curl_sha(lab, 45001) == blob_sha(lab)
    protocols = vnfs.stop_dpi(lab.dir / "dpi")
    assert protocols.get("HTTP", {}).get("flows", 0) >= 1, protocols


def test_live_trace_crosses_each_vnf_of_a_chain_in_order(lab, api):
    """A chain of three VNFs on three nodes that classifies ICMP: the live probe is seen leaving the
    switch into each VNF and coming back out of it, in chain order, and reaches the server; its
    verdict is the simulation's and ping's; every VNF's hop has a time; no flow changes and no
    observation point stays loaded."""
    def flows() -> dict[str, str]:
        return {f"{n} {b}": sh(lab, n, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "--no-stats", b).stdout
                for n in ("compute1", "compute2", "compute3") for b in ("br-int", "br-phy")}

    body = {"port_id": ids(lab)["ports"]["client"], "to_port_id": ids(lab)["ports"]["server"]}
    with chain(api, lab, [["fw1"], ["dpi"], ["fwd"]], classifiers=({"protocol": "icmp"},)):
        before = flows()
        sim, lv = api.post("/traces", json=body), api.post("/traces", json={**body, "live": True})
        assert flows() == before                       # a live trace adds no flow, and leaves none
        assert subprocess.run(host_exec.argv(["ping", "-c", "1", "-W", "2", SERVER], lab.ns("client"))).returncode == 0
    assert sim["verdict"]["result"] == lv["verdict"]["result"] == "delivered", (sim["verdict"], lv["verdict"])
    assert [h["name"] for h in sim["hops"] if h["bridge"] == "vnf"] == [h["name"] for h in lv["hops"]
                                                                           if h["bridge"] == "vnf"] != []
    seen = [(p["node"], p["dev"], p["dir"]) for p in lv["live"]["points"] if p["icmp_type"] == 8 and p["dir"] != "injected"]
    vnf_ports = [(node, dev) for node, dev, _ in seen if dev not in ("client", "server", "ul0")]
    assert vnf_ports == [("compute1", "fw1i"), ("compute1", "fw1o"), ("compute2", "dpii"), ("compute2", "dpio"),
                         ("compute3", "fwdi"), ("compute3", "fwdo")], seen
    assert seen[0] == ("compute1", "client", "ingress") and seen[-1] == ("compute3", "server", "egress"), seen
    # into a VNF from the switch (its port's egress), out of it into the switch (ingress)
    assert all(d == ("egress" if dev.endswith("i") else "ingress") for _, dev, d in seen if dev in {v[1] for v in vnf_ports})
    vnfs = [h for h in lv["hops"] if h["bridge"] == "vnf"]
    assert len(vnfs) == 3 and all(h.get("time_us", 0) > 0 for h in vnfs), vnfs
    live_watchers_end(lab, (("compute1", "client"), ("compute2", "dpii")))

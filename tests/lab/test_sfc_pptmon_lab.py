"""PPTMon on service chains through the API, on real OVS: a chain's `pptmon` makes the nodes'
agents (under the lab's controller) attach the programs on the host side of every VNF's ports;
the sink's agent delivers the records, which the controller files under the chain, group, port
pair and node from the model. Witnesses: the chain's status, the agents' reports, `tc filter show`
on the nodes, the server's bytes (sha256) and a capture at the server (no option leaves the chain),
the stored records.

compute1: client, fw1 (nft firewall); compute2: server, dpi (nDPI), proxy (HAProxy: terminates
TCP). Lab names start with 'pq'; addresses 198.19.40.0/24.
"""
from __future__ import annotations

import contextlib
import hashlib
import signal
import subprocess
import time

import pytest
from scapy.all import IP, TCP, rdpcap

from fathom.apps.hostlocal.chains import OWNER_KIND, chain_label
from fathom.client import Client
from fathom.lab import vnf as vnfs

from .util import running_lab, sh

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1241, cidr: 198.19.40.0/24}
nodes:
  - name: compute1
    vms:
      - {name: client, mac: "02:fa:00:00:28:0b", ip: 198.19.40.11/24, network: blue}
    vnfs:
      - {name: fw1, kind: firewall, rules: 20, network: blue,
         ingress: {mac: "02:fb:00:00:28:65", ip: 198.19.40.101/24}, egress: {mac: "02:fb:00:00:28:66", ip: 198.19.40.102/24}}
  - name: compute2
    vms:
      - {name: server, mac: "02:fa:00:00:28:15", ip: 198.19.40.21/24, network: blue}
    vnfs:
      - {name: dpi, kind: dpi, network: blue,
         ingress: {mac: "02:fb:00:00:28:69", ip: 198.19.40.105/24}, egress: {mac: "02:fb:00:00:28:6a", ip: 198.19.40.106/24}}
      - {name: proxy, kind: haproxy, backend: "198.19.40.21:80", network: blue,
         ingress: {mac: "02:fb:00:00:28:6f", ip: 198.19.40.111/24}, egress: {mac: "02:fb:00:00:28:70", ip: 198.19.40.112/24}}
underlay:
  cidr: 198.18.40.0/24
  mtu: 1600
"""
SERVER, PROXY_OUT = "198.19.40.21", "198.19.40.112"
BLOB = 200_000
PERIOD_NS = 5_000_000          # 200 samples/s: enough records from a few transfers
HOOKS = {"compute1": ("fw1i", "fw1o"), "compute2": ("dpii", "dpio", "proxyi", "proxyo")}


@pytest.fixture(scope="module")
def lab():
    with running_lab("pqs", TOPOLOGY, standalone=False) as lab:
        www = lab.dir / "www"
        www.mkdir()
        (www / "blob").write_bytes(hashlib.shake_256(b"fathom sfc pptmon").digest(BLOB))
        vnfs.start_web(lab.ns("server"), lab.dir / "server-web", www)
        yield lab


@pytest.fixture(scope="module")
def api(lab):
    """The lab's controller; the server's security group also admits the proxy's own connections."""
    client = Client.for_lab(lab.state())
    default = next(g for g in client.get("/security-groups") if g["project_id"] == "demo" and g["name"] == "default")
    client.post("/security-group-rules", json={
        "security_group_id": default["id"], "direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
        "port_range_min": 80, "port_range_max": 80, "remote_ip_prefix": f"{PROXY_OUT}/32"})
    yield client
    client.close()


def ids(lab) -> dict:
    return lab.state()["controller"]["created"]


@contextlib.contextmanager
def chain(api, lab, groups: list[str], ports=(80,), pptmon=None):
    """A port chain through the lab's VNFs (one group each, by name) for the client's TCP to the
    server's `ports`, with `pptmon`; deleted afterwards."""
    made = []
    try:
        gids = []
        for v in groups:
            g = api.post("/sfc/port_pair_groups", json={"name": f"pq-{v}", "port_pairs": [ids(lab)["port_pairs"][v]],
                                                          "project_id": "demo"})
            made.append(f"/sfc/port_pair_groups/{g['id']}")
            gids.append(g["id"])
        fcs = []
        for port in ports:
            fc = api.post("/sfc/flow_classifiers", json={
                "protocol": "tcp", "destination_port_range_min": port, "destination_port_range_max": port,
                "logical_source_port": ids(lab)["ports"]["client"], "logical_destination_port": ids(lab)["ports"]["server"],
                "project_id": "demo"})
            made.append(f"/sfc/flow_classifiers/{fc['id']}")
            fcs.append(fc["id"])
        ch = api.post("/sfc/port_chains", json={"name": "pq-chain", "port_pair_groups": gids, "flow_classifiers": fcs,
                                                  "project_id": "demo", "pptmon": pptmon})
        made.append(f"/sfc/port_chains/{ch['id']}")
        got = api.wait_status("sfc/port_chains", ch["id"], timeout=40)
        assert got["status"] == "active", got
        yield got
    finally:
        for path in reversed(made):
            api.delete(path)


def until(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out ({timeout} s) waiting for {what}")
        time.sleep(0.5)


def ppt_filters(lab) -> dict[str, str]:
    """`tc filter show` of every VNF port's host interface, both directions, per interface."""
    return {dev: sh(lab, node, "tc", "filter", "show", "dev", dev, "egress").stdout +
            sh(lab, node, "tc", "filter", "show", "dev", dev, "ingress").stdout
            for node, devs in HOOKS.items() for dev in devs}


def agent_objects(api) -> dict[str, dict]:
    return {a["node"]: a["objects"] for a in api.get("/agents")}


def curl_sha(lab, sport: int) -> str:
    proc = subprocess.run(["ip", "netns", "exec", lab.ns("client"), "curl", "-s", "--fail", "--max-time", "10",
                           "--local-port", str(sport), f"http://{SERVER}/blob"], capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return hashlib.sha256(proc.stdout).hexdigest()


def upload(lab, data: bytes, port: int = 9000) -> str:
    """Send `data` from the client to a sink on the server; the sha256 the server computed."""
    sink = subprocess.Popen(["ip", "netns", "exec", lab.ns("server"), "python3", "-c",
                             "import hashlib,socket\n"
                             f"s=socket.create_server(('0.0.0.0',{port})); c,_=s.accept(); h=hashlib.sha256()\n"
                             "while True:\n b=c.recv(65536)\n if not b: break\n h.update(b)\n"
                             "print(h.hexdigest())"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    up = subprocess.run(["ip", "netns", "exec", lab.ns("client"), "python3", "-c",
                         "import socket,sys\nc=socket.create_connection(('%s',%d)); c.sendall(sys.stdin.buffer.read());"
                         "c.shutdown(socket.SHUT_WR); c.recv(1)" % (SERVER, port)], input=data, capture_output=True,
                        timeout=30)
    assert up.returncode == 0, up.stderr
    out, _ = sink.communicate(timeout=30)
    return out.strip()


def has_ppt_option(pkt) -> bool:
    """Our TCP option (kind 254, ExID 0x5046) in a captured segment."""
    raw = bytes(pkt[TCP])
    opts = raw[20:(raw[12] >> 4) * 4]
    i = 0
    while i < len(opts):
        kind = opts[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(opts) or opts[i + 1] < 2:
            break
        if kind == 254 and opts[i + 2:i + 4] == b"\x50\x46":
            return True
        i += opts[i + 1]
    return False


def test_a_measured_chain_across_two_nodes(lab, api, tmp_path):
    """fw1 (compute1) → dpi (compute2) with pptmon: every hop has records that name the chain, the
    group, the port pair and the node; the server gets byte-identical data and never an option;
    the chain is active on the agents' word. Turned off, the agents detach everything."""
    data = hashlib.shake_256(b"pq upload").digest(400_000)
    with chain(api, lab, ["fw1", "dpi"], ports=(80, 9000), pptmon={"period_ns": PERIOD_NS}) as ch:
        assert ch["pptmon"] == {"period_ns": PERIOD_NS} and ch["status_reason"] is None
        pairs = {v: ids(lab)["port_pairs"][v] for v in ("fw1", "dpi")}
        objects = agent_objects(api)
        assert objects["compute1"][f"{OWNER_KIND}:{pairs['fw1']}"]["status"] == "active"
        assert objects["compute2"][f"{OWNER_KIND}:{pairs['dpi']}"]["status"] == "active"
        filters = ppt_filters(lab)
        for dev in ("fw1i", "fw1o", "dpii", "dpio"):
            assert "ppt_" in filters[dev], (dev, filters[dev])
        assert "ppt_" not in filters["proxyi"] + filters["proxyo"]

        pcap = tmp_path / "server.pcap"
        dump = subprocess.Popen(["ip", "netns", "exec", lab.ns("server"), "tcpdump", "-i", "eth0", "-U", "-n", "-s", "0",
                                 "-w", str(pcap), "tcp"], stderr=subprocess.PIPE, text=True)
        assert "listening" in dump.stderr.readline()
        try:
            blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
            for sport in range(46001, 46004):
                assert curl_sha(lab, sport) == blob
            assert upload(lab, data) == hashlib.sha256(data).hexdigest(), "the server's bytes differ"
        finally:
            time.sleep(0.5)
            dump.send_signal(signal.SIGINT)
            dump.wait(5)
        segments = [p for p in rdpcap(str(pcap)) if IP in p and TCP in p]
        assert len(segments) > 100
        assert not [p for p in segments if has_ppt_option(p)], "a PPTMon option reached the server"

        def measured():
            st = api.get(f"/sfc/port_chains/{ch['id']}/pptmon", params={"window": "10m"})
            return st if st["records"] >= 20 and all(g["processing"]["count"] for g in st["groups"]) else None
        st = until(measured, 30, "records of every hop at the controller")
        assert [(g["role"], [p["id"] for p in g["port_pairs"]], [p["node"] for p in g["port_pairs"]])
                for g in st["groups"]] == [("source", [pairs["fw1"]], ["compute1"]), ("sink", [pairs["dpi"]], ["compute2"])]
        assert st["e2e"]["count"] > 0 and st["lost_across"] <= 2 and st["warnings"] == []
        records = api.get("/pptmon/records", params={"chain": chain_label(ch["id"]), "limit": 10_000})
        assert records and all(r["port_chain_id"] == ch["id"] and r["node"] == "compute2" for r in records)
        groups = ch["port_pair_groups"]
        for r in records:
            assert [(h["group"], h["port_pair"], h["node"]) for h in r["hops"]] == \
                [(groups[0], pairs["fw1"], "compute1"), (groups[1], pairs["dpi"], "compute2")], r
        metrics = api.http.get(api.url + "/metrics").text
        assert (f'fathom_sfc_pptmon_vnf_processing_seconds_count{{chain="{ch["id"]}",group="{groups[0]}",'
                f'port_pair="{pairs["fw1"]}",node="compute1"}}') in metrics

        # off: the agents detach and say so, nothing is left on the hosts
        off = api.patch(f"/sfc/port_chains/{ch['id']}", json={"pptmon": None})
        assert off["pptmon"] is None
        until(lambda: not any(k.startswith(OWNER_KIND) for objs in agent_objects(api).values() for k in objs), 30,
              "the agents to report the chain's attachments gone")
        filters = ppt_filters(lab)
        assert not [dev for dev, text in filters.items() if "ppt_" in text], filters
        assert api.wait_status("sfc/port_chains", ch["id"], timeout=20)["status"] == "active"


def test_a_tcp_terminating_vnf_does_not_carry_the_option_and_the_chain_says_so(lab, api):
    """fw1 → proxy (HAProxy opens its own connection to the server): the first group stamps, the
    option ends with the client's connection inside the proxy, the sink reports nothing. The chain
    says how many were lost across instead of reporting times."""
    with chain(api, lab, ["fw1", "proxy"], pptmon={"period_ns": PERIOD_NS}) as ch:
        blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
        for sport in range(47001, 47004):
            assert curl_sha(lab, sport) == blob

        def warned():
            st = api.get(f"/sfc/port_chains/{ch['id']}/pptmon", params={"window": "10m"})
            return st if st["warnings"] and st["stamped"] >= 5 else None
        st = until(warned, 30, "the agents' counters to show the loss")
        assert st["reached"] == 0 and st["lost_across"] == st["stamped"] and st["records"] == 0
        assert "without the option" in st["warnings"][0] and st["e2e"]["count"] == 0
        shown = until(lambda: (c := api.get(f"/sfc/port_chains/{ch['id']}"))["status_reason"] and c, 30,
                      "the chain's status to carry the warning")
        assert shown["status"] == "active" and "without the option" in shown["status_reason"]

"""PPTMon on service chains through the API, on real OVS. A chain's `pptmon` asks the nodes' agents
to attach the programs on the VM-facing host interface of every VNF port. The lab's nodes run OVS's
userspace datapath (netdev, no openvswitch module here), whose packet socket takes a VM's packets
before TC ingress: behind a directly plugged port the programs would come too late, so the agent
refuses; behind a hybrid-plugged one (tap → Linux bridge qbr → veth qvb/qvo → br-int, os-vif's)
the Linux bridge takes them after TC ingress, and the chain is measured. Witnesses: the chain's
status, the stored records and the chain's stats, `tc filter show` on the nodes, the server's bytes
(sha256) and a capture at the server (no option reaches it).

compute1: client, fw1 (nft firewall, hybrid), fwd (forwarder, plugged directly), fw2 (forwarder,
hybrid); compute2: server,
dpi (nDPI, hybrid), proxy (HAProxy: terminates TCP, hybrid). Lab names start with 'pq'; addresses
198.19.40.0/24.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time

import pytest
from scapy.all import IP, TCP, rdpcap

from fathom.auth.client import lab_token
from fathom.bench.browser import headless_chromium
from fathom.model.chains import OWNER_KIND, chain_label
from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab import vnf as vnfs
from fathom.lab.capture import Capture

from .util import admit_web_from, running_lab, sh

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1241, cidr: 198.19.40.0/24}
nodes:
  - name: compute1
    vms:
      - {name: client, mac: "02:fa:00:00:28:0b", ip: 198.19.40.11/24, network: blue}
    vnfs:
      - {name: fw1, kind: firewall, rules: 20, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:28:65", ip: 198.19.40.101/24}, egress: {mac: "02:fb:00:00:28:66", ip: 198.19.40.102/24}}
      - {name: fwd, kind: forward, network: blue,
         ingress: {mac: "02:fb:00:00:28:67", ip: 198.19.40.103/24}, egress: {mac: "02:fb:00:00:28:68", ip: 198.19.40.104/24}}
      - {name: fw2, kind: forward, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:28:6b", ip: 198.19.40.107/24}, egress: {mac: "02:fb:00:00:28:6c", ip: 198.19.40.108/24}}
  - name: compute2
    vms:
      - {name: server, mac: "02:fa:00:00:28:15", ip: 198.19.40.21/24, network: blue}
    vnfs:
      - {name: dpi, kind: dpi, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:28:69", ip: 198.19.40.105/24}, egress: {mac: "02:fb:00:00:28:6a", ip: 198.19.40.106/24}}
      - {name: proxy, kind: haproxy, backend: "198.19.40.21:80", network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:28:6f", ip: 198.19.40.111/24}, egress: {mac: "02:fb:00:00:28:70", ip: 198.19.40.112/24}}
underlay:
  cidr: 198.18.40.0/24
  mtu: 1600
"""
SERVER, PROXY_OUT = "198.19.40.21", "198.19.40.112"
BLOB = 200_000
PERIOD_NS = 1_000_000          # 1000 samples/s: enough records from a few short transfers
# the VM-facing host interfaces of the VNFs' ports (hybrid: tap<port>; direct: the br-int port itself)
HOOKS = {"compute1": ("tapfw1i", "tapfw1o", "fwdi", "fwdo"),
         "compute2": ("tapdpii", "tapdpio", "tapproxyi", "tapproxyo")}


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
    admit_web_from(client, [PROXY_OUT])
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
        yield api.wait_status("sfc/port_chains", ch["id"], timeout=40)
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
    proc = subprocess.run(host_exec.argv(["curl", "-s", "--fail", "--max-time", "10",
                           "--local-port", str(sport), f"http://{SERVER}/blob"], lab.ns("client")), capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return hashlib.sha256(proc.stdout).hexdigest()


def upload(lab, data: bytes, port: int = 9000) -> str:
    """Send `data` from the client to a sink on the server; the sha256 the server computed."""
    sink = subprocess.Popen(host_exec.argv(["python3", "-c",
                             "import hashlib,socket\n"
                             f"s=socket.create_server(('0.0.0.0',{port})); c,_=s.accept(); h=hashlib.sha256()\n"
                             "while True:\n b=c.recv(65536)\n if not b: break\n h.update(b)\n"
                             "print(h.hexdigest())"], lab.ns("server")), stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    up = subprocess.run(host_exec.argv(["python3", "-c",
                         "import socket,sys\nc=socket.create_connection(('%s',%d)); c.sendall(sys.stdin.buffer.read());"
                         "c.shutdown(socket.SHUT_WR); c.recv(1)" % (SERVER, port)], lab.ns("client")), input=data, capture_output=True,
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


def chain_traffic(lab, tmp_path, data: bytes, sports) -> list:
    """Three GETs of the blob and an upload of `data` through the chain, checked byte for byte at
    the server; the client's segments the server captured meanwhile."""
    pcap = tmp_path / "server.pcap"
    with Capture(lab.ns("server"), "eth0", pcap, "tcp"):
        blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
        for sport in sports:
            assert curl_sha(lab, sport) == blob
        assert upload(lab, data) == hashlib.sha256(data).hexdigest(), "the server's bytes differ"
    segments = [p for p in rdpcap(str(pcap)) if IP in p and TCP in p]
    assert len(segments) > 100 and {p[IP].src for p in segments if p[TCP].dport in (80, 9000)} == {"198.19.40.11"}
    return segments


def test_the_consoles_chain_chart_gains_points_while_traffic_runs(lab, api):
    """The console's chain page (headless Chromium) on a measured chain through fw1: its chart of
    end-to-end times gains timed points while the client's GETs run through the chain."""
    url = lab.state()["controller"]["url"]
    with chain(api, lab, ["fw1"], pptmon={"period_ns": PERIOD_NS}) as ch, headless_chromium() as browser:
        assert ch["status"] == "active", ch
        browser.get(f"{url}/console/login")
        browser.execute_script("sessionStorage.setItem('fathom.token', arguments[0])", lab_token(lab.state()))
        browser.get(f"{url}/console/chain/{ch['id']}")
        timed = lambda: int(browser.execute_script("return document.getElementById('chart').dataset.timed || -1"))
        until(lambda: timed() >= 0, 10, "the chart")
        before = timed()
        blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
        sports = iter(range(46101, 46200))
        until(lambda: curl_sha(lab, next(sports)) == blob and timed() >= before + 3, 40, "three more timed points")
        assert "end to end" in browser.find_element("id", "hops").text
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_measured_chain_of_hybrid_plugged_vnfs_times_every_hop_on_the_userspace_datapath(lab, api, tmp_path):
    """fw1 (compute1) → dpi (compute2), both plugged hybrid, with pptmon on netdev nodes: the chain
    is `active`; the programs sit on the VNFs' taps (the VM-facing interfaces), none on the qvo
    ports OVS holds; every stored record names the chain, and for each hop its group, port pair and
    node, with a plausible time; the chain's stats give per-VNF and end-to-end times; the server
    gets the same bytes and never an option. Turned off, the taps hold no filter at all."""
    agents = until(lambda: (ags := {a["node"]: a for a in api.get("/agents")}) and
                   all(a["facts"].get("datapath_types") for a in ags.values()) and ags, 30, "the agents' facts")
    assert {n: a["facts"]["ovs_kernel_module"] for n, a in agents.items()} == {"compute1": False, "compute2": False}
    data = hashlib.shake_256(b"pq upload").digest(400_000)
    pairs = ids(lab)["port_pairs"]
    with chain(api, lab, ["fw1", "dpi"], ports=(80, 9000), pptmon={"period_ns": PERIOD_NS}) as ch:
        assert (ch["status"], ch["status_reason"]) == ("active", None), ch
        filters = ppt_filters(lab)
        taps = ("tapfw1i", "tapfw1o", "tapdpii", "tapdpio")
        assert all("ppt_" in filters[t] for t in taps), filters
        assert not [d for d, text in filters.items() if "ppt_" in text and d not in taps], filters
        for node, qvo in (("compute1", "qvofw1i"), ("compute2", "qvodpio")):
            assert "ppt_" not in sh(lab, node, "tc", "filter", "show", "dev", qvo, "ingress").stdout
        since = time.time_ns()
        segments = chain_traffic(lab, tmp_path, data, range(46001, 46004))
        assert not [p for p in segments if has_ppt_option(p)], "a PPTMon option reached the server"
        for v in ("fw1", "dpi"):     # the chain really steered through both VNFs
            assert int(sh(lab, v, "cat", "/sys/class/net/eth0/statistics/rx_bytes").stdout) > len(data)

        label = chain_label(ch["id"])
        def settled():      # the sinks' records delivered: the same number twice, a second apart
            got = api.get("/pptmon/records", params={"chain": label, "limit": 5000, "since": str(since)})
            time.sleep(1)
            again = api.get("/pptmon/records", params={"chain": label, "limit": 5000, "since": str(since)})
            return got if len(got) >= 10 and len(again) == len(got) else None
        records = until(settled, 40, "the chain's records")
        groups = {g["id"]: g for g in api.get("/sfc/port_pair_groups")}
        want = {1: (pairs["fw1"], "compute1"), 2: (pairs["dpi"], "compute2")}
        for r in records:
            assert r["chain"] == label and r["port_chain_id"] == ch["id"] and r["node"] == "compute2", r
            got = {h["vnf"]: (h["port_pair"], h["node"]) for h in r["hops"]}
            assert got == want, r
            assert [groups[h["group"]]["port_pairs"] for h in r["hops"]] == [[pairs["fw1"]], [pairs["dpi"]]], r
        timed = [r for r in records if r["e2e_us"] is not None]
        assert len(timed) >= 10 and len(timed) * 2 >= len(records), (len(timed), len(records), records[:3])
        for r in timed:   # a firewall's or nDPI's time: more than nothing, far less than a second
            assert all(0 < h["ppt_us"] < 1_000_000 for h in r["hops"]), r
            assert r["e2e_us"] >= sum(h["ppt_us"] for h in r["hops"]), r

        st = api.get(f"/sfc/port_chains/{ch['id']}/pptmon", params={"window": "10m"})
        assert st["records"] >= len(timed) and st["e2e"]["count"] >= len(timed) and st["e2e"]["p50_us"] > 0, st
        assert [(p["name"], p["node"]) for g in st["groups"] for p in g["port_pairs"]] == \
            [("fw1", "compute1"), ("dpi", "compute2")]
        assert all(p["processing"]["count"] > 0 and p["processing"]["p50_us"] > 0
                   for g in st["groups"] for p in g["port_pairs"]), st
        # the loaders' counters come with the agents' next reports, each node's in its own: the
        # source's (stamped) may come after the sink's (reached); the traffic is over, so once both
        # have reported the source has stamped at least what reached the sink
        st = until(lambda: (s := api.get(f"/sfc/port_chains/{ch['id']}/pptmon", params={"window": "10m"}))
                   ["reached"] > 0 and s["stamped"] >= s["reached"] and s, 30, "both agents' counters")
        assert st["warnings"] == [], st

        off = api.patch(f"/sfc/port_chains/{ch['id']}", json={"pptmon": None})
        assert off["pptmon"] is None
        back = api.wait_status("sfc/port_chains", ch["id"], timeout=20)
        assert (back["status"], back["status_reason"]) == ("active", None)
        until(lambda: not any(o.startswith(OWNER_KIND) for objs in agent_objects(api).values() for o in objs),
              20, "the agents to drop the attachments")
        for node, devs in (("compute1", taps[:2]), ("compute2", taps[2:])):
            for dev in devs:
                for direction in ("ingress", "egress"):
                    assert sh(lab, node, "tc", "filter", "show", "dev", dev, direction).stdout.strip() == "", dev


def test_a_chain_update_restarts_the_lost_across_comparison(lab, api):
    """fw1 → fw2 → dpi measured with traffic, then fw2 removed (dpi's VNF id goes from 3 to 2): the
    counters compared start again on every instance, fw1's too, so a little traffic after the
    change reads as what it is (no warning, `stamped` counting only what came after), not as the
    sink missing what fw1 stamped before."""
    def counted(chain_id):
        return until(lambda: (s := api.get(f"/sfc/port_chains/{chain_id}/pptmon", params={"window": "10m"}))
                     ["reached"] > 0 and s["stamped"] >= s["reached"] and s, 30, "both ends' counters")
    blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
    with chain(api, lab, ["fw1", "fw2", "dpi"], pptmon={"period_ns": PERIOD_NS}) as ch:
        assert ch["status"] == "active", ch
        for sport in range(46031, 46035):     # ports no other test of this module binds (TIME_WAIT)
            assert curl_sha(lab, sport) == blob
        before = counted(ch["id"])
        assert before["warnings"] == [], before
        fw1, _, dpi = ch["port_pair_groups"]
        api.patch(f"/sfc/port_chains/{ch['id']}", json={"port_pair_groups": [fw1, dpi]})
        changed = api.wait_status("sfc/port_chains", ch["id"], timeout=40)
        assert (changed["status"], changed["status_reason"]) == ("active", None), changed
        assert curl_sha(lab, 46035) == blob
        after = counted(ch["id"])
        assert after["warnings"] == [] and after["stamped"] < before["stamped"], (before, after)
        time.sleep(12)                  # the controller's check (10 s in a lab) has seen the counters
        assert api.get(f"/sfc/port_chains/{ch['id']}")["status_reason"] is None


def test_a_measured_chain_through_a_directly_plugged_vnf_on_the_userspace_datapath_is_an_error(lab, api, tmp_path):
    """fwd is plugged directly into br-int of a netdev node: its agent refuses the instance, saying
    why, holds no program for it, and the chain is `error` while its traffic still crosses fwd to
    the server byte for byte, without an option."""
    with chain(api, lab, ["fwd"], ports=(80, 9000), pptmon={"period_ns": PERIOD_NS}) as ch:
        assert ch["status"] == "error" and "runs OVS's netdev datapath" in ch["status_reason"], ch
        assert "kernel datapath" in ch["status_reason"] and "fwdi" in ch["status_reason"], ch
        said = agent_objects(api)["compute1"][f"{OWNER_KIND}:{ids(lab)['port_pairs']['fwd']}"]
        assert said["status"] == "error", said
        filters = ppt_filters(lab)
        assert not [dev for dev, text in filters.items() if "ppt_" in text], filters
        segments = chain_traffic(lab, tmp_path, hashlib.shake_256(b"pq direct").digest(200_000), range(46011, 46013))
        assert not [p for p in segments if has_ppt_option(p)], "a PPTMon option reached the server"
        assert int(sh(lab, "fwd", "cat", "/sys/class/net/eth0/statistics/rx_bytes").stdout) > 200_000
        off = api.patch(f"/sfc/port_chains/{ch['id']}", json={"pptmon": None})
        assert off["pptmon"] is None
        back = api.wait_status("sfc/port_chains", ch["id"], timeout=20)
        assert (back["status"], back["status_reason"]) == ("active", None)


HANDLER = """
import json, sys, time
from pathlib import Path
from fathom.agent.pptmon import Pptmon
from fathom.model.hostlocal import from_json
work = Path(sys.argv[1])
h = Pptmon(work / "records", work / "state", work / "bpffs", "pq-node")
objects = [from_json(o) for o in json.loads(sys.argv[2])]
out = {"apply": h.apply(objects), "held": sorted(h.held())}
if sys.argv[3] != "-":     # traffic through the hooks meanwhile (a command in the client VM)
    import subprocess
    subprocess.run(json.loads(sys.argv[3]), check=True, timeout=30)
    time.sleep(0.5)
out["counters"] = h.counters(objects)
print(json.dumps(out))
"""

UDP_TO_FW1 = ["python3", "-c",
              "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
              "for i in range(50):\n s.sendto(b'x'*100,('198.19.40.101',9999)); time.sleep(0.01)"]


def test_the_agent_holds_a_chains_attachment_by_its_own_name_and_reports_counters(lab, tmp_path):
    """The node agent's PPTMon handler (fathom.agent.pptmon) run in a node's namespace with a
    chain-derived attachment (owner port_chain_vnf:1) beside an operator's attachment of the same
    id 1: both are held under their own names, the programs sit on the host interfaces, the
    counters come from the loaders' pinned maps and count the traffic; an empty apply detaches
    both. The chain's points name fw1's qvo ports on br-int; the programs go on its taps."""
    from fathom.model.hostlocal import PptmonAttach, to_json
    derived = PptmonAttach(1, chain_label(1), 1, "source-sink", "qvofw1i:egress", "qvofw1o:ingress", 0, OWNER_KIND)
    operator = PptmonAttach(1, "pqop", 1, "source-sink", "tapfw1o:egress", "tapfw1i:ingress", 0)

    def handler(objects, traffic=None):
        argv, env = lab.exec_args("compute1", [sys.executable, "-c", HANDLER, str(tmp_path),
                                               json.dumps([to_json(o) for o in objects]),
                                               json.dumps(traffic) if traffic else "-"])
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    traffic = host_exec.argv(UDP_TO_FW1, lab.ns("client"))
    got = handler([derived, operator], traffic)
    assert {k: v["status"] for k, v in got["apply"].items()} == {f"{OWNER_KIND}:1": "active",
                                                                 "pptmon_attachment:1": "active"}, got["apply"]
    assert got["held"] == ["1", f"{OWNER_KIND}-1"]
    counters = got["counters"][f"{OWNER_KIND}:1"]
    assert counters["in_pkts"] >= 50 and counters["sampled"] >= 50, counters   # every datagram into fw1
    assert set(got["counters"]) == {f"{OWNER_KIND}:1", "pptmon_attachment:1"}
    filters = {(d, direction): sh(lab, "compute1", "tc", "filter", "show", "dev", d, direction).stdout
               for d in ("tapfw1i", "tapfw1o") for direction in ("egress", "ingress")}
    assert all("ppt_" in text for text in filters.values()), filters
    assert (tmp_path / "records" / chain_label(1)).is_dir()
    gone = handler([])
    assert gone == {"apply": {}, "held": [], "counters": {}}
    filters = {k: sh(lab, "compute1", "tc", "filter", "show", "dev", k[0], k[1]).stdout for k in filters}
    assert not [k for k, text in filters.items() if "ppt_" in text], filters


def test_a_proxy_in_the_chain_ends_the_option_and_the_counters_say_so(lab, api, tmp_path):
    """fw1 → proxy (HAProxy opens its own connection to the server), with the attachments the
    controller derives for such a chain held by the agent's handler on each node (the source on
    fw1, the sink on the proxy): the client's packets are stamped and reach the proxy with the
    option (its sink appends), but what the proxy sends on is a new connection without one, so the
    sink reports nothing. From the loaders' counters, as the agents report them, the chain's
    verdict is `lost_across` = all stamped, with the warning; no time is made up."""
    from fathom.model.chains import _placed as placed, lost_across, lost_warning
    from fathom.model.hostlocal import PptmonAttach, digest, owner_key
    from fathom.store.agents import AgentView
    bpffs = tmp_path / "bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)   # shared by the handler runs below
    try:
        with chain(api, lab, ["fw1", "proxy"]) as ch:
            pairs = {v: ids(lab)["port_pairs"][v] for v in ("fw1", "proxy")}
            label = chain_label(ch["id"])
            held = {"compute1": [PptmonAttach(pairs["fw1"], label, 1, "source", "qvofw1i:egress", "qvofw1o:ingress",
                                              0, OWNER_KIND)],
                    "compute2": [PptmonAttach(pairs["proxy"], label, 2, "sink", "qvoproxyi:egress", "qvoproxyo:ingress",
                                              0, OWNER_KIND)]}
            for node, objects in held.items():
                got = handler(lab, node, tmp_path / node, objects)
                assert {v["status"] for v in got["apply"].values()} == {"active"}, got
            blob = hashlib.sha256((lab.dir / "www" / "blob").read_bytes()).hexdigest()
            for sport in range(47001, 47004):
                assert curl_sha(lab, sport) == blob
            counters = {node: handler(lab, node, tmp_path / node, objects)["counters"]
                        for node, objects in held.items()}
            source = counters["compute1"][f"{OWNER_KIND}:{pairs['fw1']}"]
            sink = counters["compute2"][f"{OWNER_KIND}:{pairs['proxy']}"]
            assert source["sampled"] >= 20, source              # every client packet of the three GETs
            assert sink["appended"] >= 1 and sink["reported"] == 0, sink   # it arrived marked; nothing left marked
            # the controller's verdict over the same counters, for this chain measured
            snapshot = measured_snapshot(api, ch["id"])
            # the agents report the counters of loaders running the chain's current path
            measured = next(c for c in snapshot.port_chains if c.id == ch["id"])
            applied = {owner_key(a.owner): digest([a]) for _, a in placed(snapshot, measured)}
            views = {n: AgentView(n, 1, 1, {}, {k: {"status": "active", "counters": c, "applied": applied.get(k)}
                                                for k, c in cs.items()},
                                  time.time(), None) for n, cs in counters.items()}
            lost = lost_across(snapshot, ch["id"], views)
            assert lost == {"counted": True, "stamped": source["sampled"], "reached": 0,
                            "lost_across": source["sampled"]}, lost
            assert "reached the last group without the option" in lost_warning(lost)
            for node in held:
                assert handler(lab, node, tmp_path / node, [])["held"] == []
            reported = [line for f in (tmp_path / "compute2" / "records" / label).glob("*.jsonl")
                        for line in f.read_text().splitlines() if '"type":"ppt"' in line]
            assert reported == [], "the sink reported a record"
    finally:
        subprocess.run(["umount", str(bpffs)], check=False)


def test_a_loader_slower_than_the_agents_wait_is_pending_until_it_attaches(lab, tmp_path):
    """The agent's handler on compute1 with no wait at all for its loader (as when verifying the
    programs on a crowded host takes longer than the wait): the real loader goes on loading, the
    attachment is `pending` (still loading), not `error`; a later apply finds the same loader
    attached (`active`) with its programs on fw1's taps."""
    from fathom.model.hostlocal import PptmonAttach
    att = PptmonAttach(1, chain_label(1), 1, "source-sink", "qvofw1i:egress", "qvofw1o:ingress", 0, OWNER_KIND)
    key, work = f"{OWNER_KIND}:1", tmp_path / "compute1"
    bpffs = tmp_path / "bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    try:
        first = handler(lab, "compute1", work, [att], attach_timeout=0)["apply"][key]
        assert first["status"] == "pending" and "still loading" in first["reason"], first
        loader = json.loads((work / "state" / "pptmon" / f"{OWNER_KIND}-1.json").read_text())["pid"]
        deadline = time.monotonic() + 60
        while (got := handler(lab, "compute1", work, [att], attach_timeout=0)["apply"][key])["status"] == "pending":
            assert time.monotonic() < deadline, got
            time.sleep(0.5)
        assert got["status"] == "active", got
        assert json.loads((work / "state" / "pptmon" / f"{OWNER_KIND}-1.json").read_text())["pid"] == loader
        for dev, direction in (("tapfw1i", "egress"), ("tapfw1o", "ingress")):
            assert "ppt_" in sh(lab, "compute1", "tc", "filter", "show", "dev", dev, direction).stdout
        assert handler(lab, "compute1", work, [])["held"] == []
    finally:
        handler(lab, "compute1", work, [])
        subprocess.run(["umount", str(bpffs)], check=False)


def measured_snapshot(api, chain_id: int):
    """The lab's model as the controller has it, with the chain measured and the nodes on the
    kernel datapath (what `lost_across` is meant for), built from the API's answers."""
    from dataclasses import replace

    from fathom.model import ChainPptmon, Node, Port, PortChain, PortPair, PortPairGroup, Snapshot
    nodes = tuple(Node(n["id"], n["name"], n["role"], n["tunnel_ip"], n["management_ip"], datapath_type="system")
                  for n in api.get("/nodes"))
    ports = tuple(Port(p["id"], p["name"], p["project_id"], p["network_id"], p["mac_address"], node=p["node"],
                       interface=p["interface_name"]) for p in api.list("/ports"))
    pairs = tuple(PortPair(p["id"], p["name"], p["project_id"], p["ingress"], p["egress"])
                  for p in api.get("/sfc/port_pairs"))
    groups = tuple(PortPairGroup(g["id"], g["name"], g["project_id"], tuple(g["port_pairs"]))
                   for g in api.get("/sfc/port_pair_groups"))
    c = api.get(f"/sfc/port_chains/{chain_id}")
    chain = PortChain(c["id"], c["name"], c["project_id"], tuple(c["port_pair_groups"]), tuple(c["flow_classifiers"]))
    return Snapshot(nodes=nodes, ports=ports, port_pairs=pairs, port_pair_groups=groups,
                    port_chains=(replace(chain, pptmon=ChainPptmon(0)),))


HANDLER_RUN = """
import json, sys
from pathlib import Path
from fathom.agent import pptmon
from fathom.model.hostlocal import from_json
work, bpffs = Path(sys.argv[1]), Path(sys.argv[2])
if sys.argv[4] != "-":
    pptmon.ATTACH_TIMEOUT = float(sys.argv[4])
h = pptmon.Pptmon(work / "records", work / "state", bpffs, "pq-node")
objects = [from_json(o) for o in json.loads(sys.argv[3])]
print(json.dumps({"apply": h.apply(objects), "held": sorted(h.held()), "counters": h.counters(objects)}))
"""


def handler(lab, node: str, work, objects, attach_timeout: float | None = None) -> dict:
    """One apply of the agent's PPTMon handler in `node`'s namespace (its loaders outlive it, as
    they outlive the agent), with the bpffs the test mounted and, if given, another wait for a
    loader to attach; what it answered."""
    from fathom.model.hostlocal import to_json
    argv, env = lab.exec_args(node, [sys.executable, "-c", HANDLER_RUN, str(work), str(work.parent / "bpffs"),
                                     json.dumps([to_json(o) for o in objects]),
                                     "-" if attach_timeout is None else str(attach_timeout)])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])

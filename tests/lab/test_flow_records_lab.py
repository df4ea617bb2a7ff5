"""Flow records on the lab's real OVS (userspace datapath): each node's agent collects the IPFIX its
OVS sends, the controller files the records under their project, port and rule.

Project p: vm1 (c1) and vm2 (c2) on one VXLAN network; vm2 is in group web only (ingress TCP and
UDP 5201 from anywhere). Sampling 1:1 for what ports send (and so what leaves through the tunnel
to p's ports), admissions and drops. Witnesses: iperf3's
own byte count as the client sent them (UDP: every datagram crosses vm1's port once, where TCP's
retransmissions would count twice; what the server receives may be less: loss beyond the port),
the SYNs a refused connection attempt sends (nc).
"""
import json
import subprocess
import time
from pathlib import Path

import pytest

from fathom.host import exec as host_exec
from fathom.host.iperf import iperf3
from fathom.lab.ovs import wait_for
from fathom.model import flow_records as fr

from .util import lab_api, running_lab, sh

pytestmark = pytest.mark.lab

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1441, cidr: 198.19.44.0/24, project: p}
  - {name: qnet, type: vxlan, segmentation_id: 1442, cidr: 198.19.45.0/24, project: q}
nodes:
  - name: c1
    vms:
      - {name: vm1, mac: "02:fc:00:00:44:0b", ip: 198.19.44.11/24, network: blue}
  - name: c2
    vms:
      - {name: vm2, mac: "02:fc:00:00:44:15", ip: 198.19.44.21/24, network: blue}
      - {name: q1, mac: "02:fc:00:00:45:16", ip: 198.19.45.22/24, network: qnet}
"""
VM1, VM2 = "198.19.44.11", "198.19.44.21"
HEADERS = 28      # IPv4 (20) + UDP (8): what a datagram adds to iperf3's payload


def _records(api, **params) -> list[dict]:
    r = api.get("/flow-records", params={"since": 120, "limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["records"]


def test_records_name_ports_and_rules_count_bytes_and_stay_in_their_project():
    with running_lab("qe1", TOPOLOGY, standalone=False) as lab, lab_api(lab) as api:
        ports = {p["name"]: p for p in api.get("/ports").json()}
        web = api.post("/security-groups", json={"name": "web", "project_id": "p"}).json()
        rule, _ = (api.post("/security-group-rules", json={"security_group_id": web["id"], "direction": "ingress",
                                                          "protocol": proto, "port_range_min": 5201}).json()
                   for proto in ("tcp", "udp"))
        assert api.patch(f"/ports/{ports['vm2']['id']}", json={"security_groups": [web["id"]]}).status_code == 200
        r = api.put("/flow-records/config", json={"project_id": "p", "ingress": 1, "admit": 1, "drop": 1})
        assert r.status_code == 200, r.text
        vm1_sent = f"obs_point_id={fr.point_id(fr.PORT_INGRESS, ports['vm1']['id'])})"
        vm2_drop = f"obs_point_id={fr.point_id(fr.DROP_INGRESS, ports['vm2']['id'])})"
        admitted = f"obs_point_id={fr.point_id(fr.ADMIT_INGRESS, rule['id'])})"
        to_vm2 = f"obs_point_id={fr.point_id(fr.TUNNEL_EGRESS, ports['vm2']['id'])})"
        for node, text in (("c1", vm1_sent), ("c2", vm2_drop), ("c2", admitted), ("c1", to_vm2)):
            wait_for(lambda: text in sh(lab, node, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int").stdout,
                     timeout=30, what=f"{text} on {node}'s br-int")
        for node in ("c1", "c2"):     # the agents set up their OVS's IPFIX export (checked every 10 s)
            wait_for(lambda: "127.0.0.1:4739" in sh(lab, node, "ovs-vsctl", "list", "IPFIX").stdout,
                     timeout=20, what=f"{node}'s IPFIX export")

        result = iperf3(lab.ns("vm1"), lab.ns("vm2"), VM2, udp_mbps=40, length=1400, seconds=2)
        sent = result.end["sum"]["bytes"]          # the client's count
        # a refused attempt: SYNs to vm2:22, which web does not admit
        subprocess.run(host_exec.argv(["nc", "-z", "-w", "2", VM2, "22"], lab.ns("vm1")), capture_output=True)

        def data_records(rate: int = 1, but: int | None = None, kind: str = "port-ingress") -> list[dict]:
            """vm1's records of its largest UDP stream to vm2:5201 (but the one from port `but`)
            sampled at one in `rate`."""
            recs = [r for r in _records(api, port=ports["vm1"]["id"], kind=kind)
                    if r["dst"] == VM2 and r["dport"] == 5201 and r["proto"] == 17 and r["rate"] == rate
                    and r["sport"] != but]
            by_conn: dict[int, list[dict]] = {}
            for r in recs:
                by_conn.setdefault(r["sport"], []).append(r)
            return max(by_conn.values(), key=lambda rs: sum(r["bytes"] for r in rs), default=[])

        def payload(rate: int = 1, but: int | None = None) -> int:
            return sum(r["bytes"] - HEADERS * r["packets"] for r in data_records(rate, but))
        # records come an interval (5 s) after their samples: all of them, then the sum
        total = _settled(payload, timeout=40)
        assert abs(total - sent) <= 0.02 * sent, (total, sent)
        recs = data_records()
        assert {(r["node"], r["port"], r["project"], r["network_id"], r["rate"]) for r in recs} == {
            ("c1", "vm1", "p", ports["vm1"]["network_id"], 1)}
        # the same datagrams as they left c1 through the tunnel for vm2 on c2: the same stream, the
        # same bytes (the inner frame's) as where vm1's port sent them, within the samples
        # ovs-vswitchd may drop on a busy host (two upcalls a datagram here)
        tunnel = [r for r in data_records(kind="tunnel-egress") if r["sport"] == recs[0]["sport"]]
        assert {(r["node"], r["port"], r["project"], r["network_id"], r["remote_node"], r["rate"]) for r in tunnel} == {
            ("c1", "vm1", "p", ports["vm2"]["network_id"], "c2", 1)}
        sent_bytes, left_bytes = (sum(r["bytes"] for r in rs) for rs in (recs, tunnel))
        assert abs(left_bytes - sent_bytes) <= 0.02 * sent_bytes, (left_bytes, sent_bytes)

        wait_for(lambda: _records(api, view="drops", port=ports["vm2"]["id"]), timeout=15, what="vm2's drops")
        (drop,) = _records(api, view="drops", port=ports["vm2"]["id"])
        assert (drop["kind"], drop["rule"], drop["project"]) == ("drop-ingress", fr.DEFAULT_DROP, "p")
        assert drop["packets"] >= 1
        syn = [r for r in _records(api, port=ports["vm2"]["id"], kind="drop") if r["dport"] == 22]
        assert syn and all(r["src"] == VM1 and r["node"] == "c2" for r in syn)
        admissions = _records(api, rule=str(rule["id"]))
        assert admissions
        assert {(r["kind"], r["port"], r["dport"]) for r in admissions} == {("admit-ingress", "vm2", 5201)}

        # another project's member sees none of it
        q = api.post("/tokens", json={"project_id": "q", "roles": ["member"]}).json()["token"]
        other = {"Authorization": f"Bearer {q}"}
        assert api.get("/flow-records", params={"since": 120}, headers=other).json()["records"] == []
        assert api.get("/flow-records", params={"view": "top"}, headers=other).json()["records"] == []
        assert api.get("/flow-records", params={"since": 120, "kind": "tunnel-egress"},
                       headers=other).json()["records"] == []
        assert api.get("/flow-records", params={"project": "p"}, headers=other).status_code == 403
        metrics = api.get(str(api.base_url).removesuffix("/v1/") + "/metrics").text
        assert 'fathom_flow_records_bytes_total{kind="port-ingress",project="p"}' in metrics
        status = {n: _agent_status(lab, n) for n in ("c1", "c2")}
        assert all(s["malformed"] == 0 and s["exporting"] for s in status.values()), status

        # one in 100: the estimate of a stream of ~72,000 small datagrams (12,000/s, a rate the
        # datapath takes without loss; ~720 samples: the estimate's standard deviation is ~3.7 %)
        # within 10 % of iperf3's count
        r = api.put("/flow-records/config", json={"project_id": "p", "ingress": 100, "admit": 100, "drop": 1})
        assert r.status_code == 200, r.text
        one_in_100 = f"sample(probability={fr.probability(100)},collector_set_id=1,obs_domain_id=1,{vm1_sent}"
        wait_for(lambda: one_in_100 in sh(lab, "c1", "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int").stdout,
                 timeout=30, what="vm1's samples at one in 100")
        result = iperf3(lab.ns("vm1"), lab.ns("vm2"), VM2, udp_mbps=6.2, length=64, seconds=6)
        sent = result.end["sum"]["bytes"]
        # OVS counts each sample as the 100 packets it stands for
        estimate = _settled(lambda: payload(100, but=recs[0]["sport"]), timeout=40)
        assert abs(estimate - sent) <= 0.1 * sent, (estimate, sent)


def _settled(read, timeout: float, every: float = 6.0) -> int:
    """read()'s value once two readings `every` s apart (more than an agent's interval) agree: every
    interval holding the stream's samples has been delivered."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        value = read()
        if value and value == last:
            return value
        assert time.monotonic() < deadline, f"still changing after {timeout} s: {last} -> {value}"
        last = value
        time.sleep(every)


def _agent_status(lab, node: str) -> dict:
    """The node's agent's flow-records collector, as its status file says."""
    st = json.loads((Path(lab.node(node).rundir) / "agent" / "status.json").read_text())
    return st["host_local"]["flow_records"]

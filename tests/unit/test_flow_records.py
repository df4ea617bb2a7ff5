"""Flow records from the node to the API: the IPFIX reader on what OVS 3.1 really sent (captured
from a netdev bridge with `sample` actions: tests/unit/golden/ipfix) and on forged or broken
messages, the agent's collector (bounds, bad input counted), and the controller's config, ingestion
(only a node's own ports, scaled by the rate) and queries (a tenant sees its own only)."""
from __future__ import annotations

import ipaddress
import random
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from fathom.agent.flow_records import Aggregator, FlowRecords
from fathom.agent.ipfix import Malformed, Reader
from fathom.model import flow_batch as fb
from fathom.model import flow_records as fr

from .auth import headers_for
from .test_api import MEMBER, OTHER, Client

CAPTURE = sorted((Path(__file__).parent / "golden" / "ipfix").glob("msg*.bin"))


def _read_capture() -> tuple[Reader, list[dict]]:
    reader, records = Reader(), []
    for path in CAPTURE:
        records += [r for r in reader.read(path.read_bytes()).records if "point" in r]
    return reader, records


def test_the_reader_decodes_what_ovs_sent():
    """5 pings (both ways) sampled at point 42 and a TCP SYN twice at point 99, as
    `ovs-ofctl dump-ipfix-flow` counted them (12 sampled packets)."""
    reader, records = _read_capture()
    assert len(records) == 12 and len(reader.templates) == 89
    pings = [r for r in records if r["point"] == 42]
    assert len(pings) == 10 and all(r["proto"] == 1 and r["bytes"] == 84 and r["packets"] == 1 for r in pings)
    assert {(r["src"], r["dst"], r["icmp_type"]) for r in pings} == {("198.18.99.1", "198.18.99.2", 8),
                                                                      ("198.18.99.2", "198.18.99.1", 0)}
    syn = [r for r in records if r["point"] == 99]
    assert len(syn) == 2 and all(r["proto"] == 6 and r["dport"] == 9 and r["bytes"] == 60 for r in syn)


def _message(sets: bytes, domain: int = fr.OBS_DOMAIN, version: int = 10, length: int | None = None) -> bytes:
    return struct.pack("!HHIII", version, length if length is not None else 16 + len(sets), 0, 0, domain) + sets


def _set(set_id: int, body: bytes) -> bytes:
    return struct.pack("!HH", set_id, 4 + len(body)) + body


TEMPLATE = _set(2, struct.pack("!HH", 300, 4) + struct.pack("!HHHHHHHH", 138, 4, 8, 4, 12, 4, 1, 8))


def _data(point: int, octets: int = 100) -> bytes:
    return _set(300, struct.pack("!I", point) + bytes([198, 18, 0, 1, 198, 18, 0, 2]) + struct.pack("!Q", octets))


def test_a_template_and_its_data_in_one_message():
    msg = Reader().read(_message(TEMPLATE + _data(7)))
    assert msg.records == [{"point": 7, "src": "198.18.0.1", "dst": "198.18.0.2", "bytes": 100}]


@pytest.mark.parametrize("data, why", [
    (b"\x00\x0a", "shorter than a message header"),
    (_message(TEMPLATE, version=9), "version 9"),
    (_message(TEMPLATE, length=200), "message length 200"),
    (_message(TEMPLATE + b"\x01\x2c\x00\x40"), "does not fit"),
    (_message(_set(2, struct.pack("!HH", 300, 0))), "has 0 fields"),
    (_message(_set(2, struct.pack("!HH", 100, 1) + struct.pack("!HH", 1, 8))), "template id 100"),
    (_message(_set(2, struct.pack("!HH", 300, 2) + struct.pack("!HH", 1, 8))), "cut short"),
    (_message(_set(2, struct.pack("!HH", 300, 1) + struct.pack("!HH", 8, 9))), "field 8 of length 9"),
    (_message(_set(7, b"")), "reserved"),
    (_message(TEMPLATE + _set(300, b"\x00" * 5 + b"\x01" * 3)), "not padding"),
])
def test_malformed_messages_are_refused_whole(data, why):
    reader = Reader()
    with pytest.raises(Malformed, match=why):
        reader.read(data)
    assert reader.templates == {}


def test_data_before_its_template_is_skipped_and_counted_then_read():
    reader = Reader()
    assert reader.read(_message(_data(7))).unknown_sets == 1
    reader.read(_message(TEMPLATE))
    assert reader.read(_message(_data(7))).records[0]["point"] == 7


def test_templates_are_bounded():
    reader = Reader(max_templates=2)
    sets = b"".join(_set(2, struct.pack("!HH", t, 1) + struct.pack("!HH", 1, 8)) for t in (300, 301, 302))
    with pytest.raises(Malformed, match="more than 2 templates"):
        reader.read(_message(sets))


class _NoHttp:
    def post(self, *_a, **_k):
        raise AssertionError("nothing is delivered in this test")


def _collector(**kw) -> FlowRecords:
    c = FlowRecords(_NoHttp(), port=0, **kw)
    c.sock.close()
    return c


def test_the_collector_counts_what_it_does_not_keep():
    c = _collector()
    point = fr.point_id(fr.PORT_INGRESS, 5)
    c.receive(_message(TEMPLATE + _data(point)), "198.18.0.9", 1.0)              # not the loopback
    c.receive(_message(TEMPLATE + _data(point))[:-3], "127.0.0.1", 1.0)         # cut short
    c.receive(_message(TEMPLATE + _data(point), domain=9), "127.0.0.1", 1.0)    # another domain
    c.receive(_message(TEMPLATE + _data(0xF0000001)), "127.0.0.1", 1.0)         # a kind fathom never makes
    assert (c.counters["foreign"], c.counters["malformed"], c.counters["other_domain"]) == (1, 1, 1)
    assert c.agg.counters["unknown_point"] == 1 and not c.agg.flows
    for _ in range(3):
        c.receive(_message(TEMPLATE + _data(point, octets=1000)), "127.0.0.1", 2.0)
    c.close_interval(3.0)
    (end, (rec,)), = c.pending
    assert (rec["point"], rec["packets"], rec["bytes"]) == (point, 3, 3000)


def test_a_flood_of_new_flows_is_bounded_and_counted():
    agg = Aggregator(max_flows=100)
    for i in range(1000):
        agg.add({"point": fr.point_id(fr.PORT_INGRESS, 5), "src": "198.18.0.1", "dst": "198.18.0.2", "proto": 17,
                 "sport": i, "dport": 53, "packets": 1, "bytes": 60}, 1.0)
    assert len(agg.flows) == 100 and agg.counters["evicted"] == 900
    assert len(agg.take()) == 100 and not agg.flows


def test_undelivered_intervals_are_bounded():
    c = _collector(max_pending=2)
    for t in range(5):
        c.agg.add({"point": fr.point_id(fr.PORT_INGRESS, 5), "src": "198.18.0.1", "dst": "198.18.0.2"}, t)
        c.close_interval(t)
    assert len(c.pending) == 2 and c.counters["lost_intervals"] == 3


# ---------------------------------------------------------------------------------------------- the API


@pytest.fixture
def api(db_url):
    client = Client(db_url)
    for i, name in enumerate(("c1", "c2")):
        client.post("/nodes", {"name": name, "tunnel_ip": f"198.18.0.{i + 1}"})
    for project in ("p1", "p2"):
        net = client.post("/networks", {"name": project, "project_id": project})
        client.post("/subnets", {"network_id": net["id"], "cidr": f"198.19.{project[1]}.0/24"})
        setattr(client, project, net)
    client.vm1 = client.post("/ports", {"network_id": client.p1["id"], "name": "vm1", "node": "c1",
                                        "interface_name": "vm1"})
    client.vm2 = client.post("/ports", {"network_id": client.p1["id"], "name": "vm2", "node": "c2",
                                        "interface_name": "vm2"})
    client.vm3 = client.post("/ports", {"network_id": client.p2["id"], "name": "vm3", "node": "c1",
                                        "interface_name": "vm3"})
    yield client
    client.app.state.engine.dispose()


def _put(api, body, status=200, who=None):
    r = api.http.put("/v1/flow-records/config", json=body, headers=api.who(who))
    assert r.status_code == status, r.text
    return r.json()


def test_config_is_authorised_and_bounded(api):
    assert _put(api, {"drop": 1, "ingress": 100}, who=MEMBER) == {
        "project_id": "p1", "port_id": None, "ingress": 100, "admit": 0, "drop": 1}
    _put(api, {"ingress": 10}, 422, who=MEMBER)                       # members: at most 1 in 100
    _put(api, {"project_id": "p2", "drop": 1}, 403, who=MEMBER)       # not another project's
    _put(api, {"port_id": api.vm3["id"], "drop": 1}, 404, who=MEMBER)  # nor its ports
    _put(api, {"drop": 70000}, 422, who=MEMBER)
    _put(api, {"drop": 1, "bogus": 1}, 422, who=MEMBER)
    _put(api, {"port_id": api.vm1["id"], "ingress": 1})                # admins: 1:1
    _put(api, {"port_id": api.vm1["id"], "ingress": 1})                # again: one row
    assert len(api.get("/flow-records/config")) == 2
    assert api.get("/flow-records/config", headers=OTHER) == []
    r = api.http.delete("/v1/flow-records/config", params={"port_id": api.vm1["id"]}, headers=api.who(MEMBER))
    assert r.status_code == 200 and len(api.get("/flow-records/config", headers=MEMBER)) == 1


def _ip(port) -> str:
    return port["fixed_ips"][0]["ip_address"]


def _record(point, src, dst, packets=10, bytes_=15000, dport=5201):
    return {"point": point, "src": src, "dst": dst, "proto": 6, "sport": 40000, "dport": dport,
            "packets": packets, "bytes": bytes_, "first": 1.0, "last": 2.0}


def _ingest(api, node, records, status=200, body: bytes | None = None, content_type=fb.CONTENT_TYPE):
    """POST `records` as node `node`'s agent (or `body` as it is): the answer."""
    headers = {**headers_for(api.app, "admin", ("agent",), node=node), "Content-Type": content_type}
    r = api.http.post("/v1/flow-records/ingest", headers=headers,
                      content=fb.encode(records, time.time(), 5) if body is None else body)
    assert r.status_code == status, r.text
    return r.json()


def test_a_node_reports_its_own_ports_only_and_counts_are_scaled(api):
    _put(api, {"project_id": "p1", "ingress": 100, "drop": 1})
    vm1, vm2, vm3 = api.vm1, api.vm2, api.vm3
    rule = next(r for r in api.get("/security-group-rules", headers=MEMBER) if r["direction"] == "egress")
    out = _ingest(api, "c1", [
        _record(fr.point_id(fr.PORT_INGRESS, vm1["id"]), _ip(vm1), _ip(vm2), 200),          # kept: 2 samples
        _record(fr.point_id(fr.DROP_EGRESS, vm1["id"]), _ip(vm1), _ip(vm2), 1, 60, 22),      # kept, x1
        _record(fr.point_id(fr.ADMIT_EGRESS, rule["id"]), _ip(vm1), _ip(vm2), 1, 60),        # vm1's group's rule
        _record(fr.point_id(fr.PORT_INGRESS, vm2["id"]), _ip(vm2), _ip(vm1)),                # vm2 is on c2
        _record(fr.point_id(fr.PORT_INGRESS, vm1["id"]), "198.19.9.9", _ip(vm2)),            # not vm1's address
        _record(fr.point_id(fr.ADMIT_EGRESS, rule["id"]), _ip(vm3), _ip(vm1), 1, 60),        # vm3's groups: p2's
        _record(0xF0000001, _ip(vm1), _ip(vm2)),
    ])
    assert out["accepted"] == 3 and out["refused_by_reason"] == {"not_this_node": 2, "rule": 1, "point": 1}
    # another node's agent: its records are filed under its own node, where vm1 is not
    assert _ingest(api, "c2", [_record(fr.point_id(fr.PORT_INGRESS, vm1["id"]), _ip(vm1), _ip(vm2))])[
        "refused_by_reason"] == {"not_this_node": 1}
    # an admin's token is no agent's; no token at all
    body = fb.encode([], 1, 5)
    for headers, status in (({}, 403), ({"Authorization": ""}, 401)):
        assert api.http.post("/v1/flow-records/ingest", content=body,
                             headers={"Content-Type": fb.CONTENT_TYPE, **headers}).status_code == status
    recs = api.get("/flow-records", headers=MEMBER)["records"]
    by_kind = {r["kind"]: r for r in recs}
    # OVS's counts are kept (it counts a sample at 1:100 as 65535 // 655 = 100 packets)
    assert by_kind["port-ingress"]["bytes"] == 15000 and by_kind["port-ingress"]["port"] == "vm1"
    assert (by_kind["port-ingress"]["packets"], by_kind["port-ingress"]["sampled_packets"]) == (200, 2)
    assert by_kind["drop-egress"]["rule"] == fr.DEFAULT_DROP and by_kind["drop-egress"]["packets"] == 1
    assert by_kind["admit-egress"]["rule"] == rule["id"]
    assert api.get("/flow-records", headers=OTHER)["records"] == []
    assert api.http.get("/v1/flow-records", params={"project": "p1"}, headers=api.who(OTHER)).status_code == 403
    top = api.get("/flow-records", view="top", headers=MEMBER)["records"]
    assert [(t["port"], t["bytes"]) for t in top] == [("vm1", 15000)]
    drops = api.get("/flow-records", view="drops", headers=MEMBER)["records"]
    assert [(d["port"], d["rule"], d["packets"]) for d in drops] == [("vm1", fr.DEFAULT_DROP, 1)]
    assert api.get("/flow-records", rule=str(rule["id"]), headers=MEMBER)["records"][0]["kind"] == "admit-egress"
    assert REGISTRY.get_sample_value("fathom_flow_records_dropped_packets_total", {"project": "p1"}) >= 1
    assert REGISTRY.get_sample_value("fathom_flow_records_refused_total",
                                     {"node": "c1", "reason": "not_this_node"}) >= 2


def _packed(records: list[tuple], addresses=(b"\xc6\x13\x01\x01",), n: int | None = None, end=1.0,
            interval=5.0) -> bytes:
    """A batch of records given as tuples of fb.COLUMNS' values (forged: nothing checked on this side)."""
    n4 = sum(len(a) == 4 for a in addresses)
    columns = zip(*records) if records else [()] * len(fb.COLUMNS)
    return (fb.HEADER.pack(end, interval, n4, len(addresses) - n4, len(records) if n is None else n)
            + b"".join(addresses)
            + b"".join(struct.pack(f"!{len(values)}{code}", *values) for (_, code), values in zip(fb.COLUMNS, columns)))


GOOD = (fr.point_id(fr.PORT_INGRESS, 1), 0, 0, 6, 1, 2, 3, 4500, 1000, 2000)


@pytest.mark.parametrize("body, field", [
    (b"", "body"),
    (_packed([GOOD])[:-1], "body"),                                     # cut short
    (_packed([GOOD]) + b"\x00", "body"),                               # a byte too many
    (_packed([GOOD], n=2), "body"),                                     # counts one record more than it holds
    (_packed([GOOD] * (fb.MAX_RECORDS + 1)), "records"),
    (_packed([GOOD], addresses=(b"\x01" * 4,) * 3), "addresses"),        # more addresses than 2 per record
    (_packed([GOOD[:1] + (1,) + GOOD[2:]]), "src"),                     # an address the batch does not hold
    (_packed([GOOD[:2] + (7,) + GOOD[3:]]), "dst"),
    (_packed([GOOD[:6] + (fb.MAX_PACKETS + 1,) + GOOD[7:]]), "packets"),
    (_packed([GOOD[:7] + (fb.MAX_BYTES + 1,) + GOOD[8:]]), "bytes"),
    (_packed([GOOD[:9] + (2 ** 64 - 1,)]), "last"),
    (_packed([GOOD], end=float("nan")), "interval_end"),
    (_packed([GOOD], end=-1.0), "interval_end"),
    (_packed([GOOD], interval=0.0), "interval_s"),
    (_packed([GOOD], interval=float("inf")), "interval_s"),
])
def test_a_malformed_batch_is_refused_whole(body, field):
    with pytest.raises(fb.BadBatch) as e:
        fb.decode(body)
    assert e.value.field == field


def test_a_batch_reads_back_what_was_packed():
    records = [_record(fr.point_id(fr.PORT_INGRESS, 3), "198.19.1.3", "2001:DB8:0::1"),
               _record(fr.point_id(fr.DROP_INGRESS, 4), "::ffff:198.19.1.3", "198.19.1.3", 7, 420, 22)]
    batch = fb.decode(fb.encode(records, 1234.5, 5))
    assert (batch.interval_end, batch.interval_s) == (1234.5, 5)
    assert [(p, batch.addresses[s], batch.addresses[d], *rest) for p, s, d, *rest in batch.records()] == [
        (r["point"], str(ipaddress.ip_address(r["src"])), str(ipaddress.ip_address(r["dst"])), r["proto"], r["sport"],
         r["dport"], r["packets"], r["bytes"], r["first"] * 1000, r["last"] * 1000) for r in records]
    assert batch.addresses[batch.columns[2][0]] == "2001:db8::1"       # addresses in their canonical text


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.data())
def test_any_change_to_a_batch_is_read_or_refused_never_an_error(data):
    """A valid batch, bytes of it overwritten, cut or added: decode returns a batch within every
    bound, or raises BadBatch; nothing else."""
    body = bytearray(fb.encode([_record(fr.point_id(fr.PORT_INGRESS, i), f"198.19.1.{i}", "2001:db8::9", i)
                                for i in range(1, 4)], 1.0, 5))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body)))
        body[at:at + data.draw(st.integers(0, 8))] = data.draw(st.binary(max_size=8))
    try:
        batch = fb.decode(bytes(body))
    except fb.BadBatch:
        return
    assert len(batch) <= fb.MAX_RECORDS and 0 < batch.interval_s <= fb.MAX_INTERVAL
    for _, src, dst, _, _, _, packets, nbytes, first, last in batch.records():
        assert max(src, dst) < len(batch.addresses) and packets <= fb.MAX_PACKETS and nbytes <= fb.MAX_BYTES
        assert max(first, last) <= fb.MAX_TIME * 1000


def test_batches_are_bounded_and_rate_limited(api):
    rec = _record(fr.point_id(fr.PORT_INGRESS, api.vm1["id"]), _ip(api.vm1), _ip(api.vm2))
    _ingest(api, "c1", [], 422, body=_packed([GOOD], n=2))
    _ingest(api, "c1", [], 422, body=_packed([GOOD] * (fb.MAX_RECORDS + 1)))
    _ingest(api, "c1", [], 415, body=b'{"records": []}', content_type="application/json")   # the packed format only
    assert _ingest(api, "c1", [rec, {**rec, "src": "::ffff:" + rec["src"]}])[
        "refused_by_reason"] == {"not_this_node": 1}      # the mapped IPv6 address is not vm1's
    rng = random.Random(44)                 # forged bodies through the API: 422 (or a batch read), never 5xx
    good = fb.encode([rec] * 3, time.time(), 5)
    agent = {"Content-Type": fb.CONTENT_TYPE, **headers_for(api.app, "admin", ("agent",), node="c1")}
    for _ in range(60):
        body = bytearray(good)
        at = rng.randrange(len(body))
        body[at:at + rng.randrange(9)] = rng.randbytes(rng.randrange(9))
        r = api.http.post("/v1/flow-records/ingest", content=bytes(body), headers=agent)
        assert r.status_code in (200, 422), r.text
    store = api.app.state.flow_records
    store.rate, store.burst = 10, 20
    _ingest(api, "c1", [rec] * 20)
    _ingest(api, "c1", [rec] * 20, 429)
    store._buckets.clear()                  # a full bucket takes a batch beyond the burst, then owes it
    _ingest(api, "c1", [rec] * 30)
    _ingest(api, "c1", [rec], 429)


def test_chain_hop_records_are_filed_under_the_chain_on_its_nodes_only(api):
    """A chain of p1 (classifier at vm1 on c1, a VNF instance fw on c2): c1 and c2 may report its
    hops, filed under p1 and the chain (hop and direction from the point id), scaled by p1's
    ingress rate; c1 cannot report a chain of p2 with nothing on c1, nor a point that is no hop."""
    from fathom.model.chains import hop_marker
    vm1, vm2 = api.vm1, api.vm2
    fw = [api.post("/ports", {"network_id": api.p1["id"], "name": f"fw{s}", "node": "c2", "interface_name": f"fw{s}",
                              "port_security": False})["id"] for s in "io"]
    pair = api.post("/sfc/port_pairs", {"name": "fw", "ingress": fw[0], "egress": fw[1], "project_id": "p1"})
    group = api.post("/sfc/port_pair_groups", {"port_pairs": [pair["id"]], "project_id": "p1"})
    fc = api.post("/sfc/flow_classifiers", {"logical_source_port": vm1["id"], "protocol": "tcp", "project_id": "p1"})
    chain = api.post("/sfc/port_chains", {"port_pair_groups": [group["id"]], "flow_classifiers": [fc["id"]],
                                          "project_id": "p1"})
    vm3 = api.vm3       # p2's, on c1: a chain of p2 reaching no port on c1 cannot be reported by c1
    fw2 = [api.post("/ports", {"network_id": api.p2["id"], "name": f"fw2{s}", "node": "c2", "interface_name": f"fw2{s}",
                               "port_security": False})["id"] for s in "io"]
    pair2 = api.post("/sfc/port_pairs", {"name": "fw2", "ingress": fw2[0], "egress": fw2[1], "project_id": "p2"})
    group2 = api.post("/sfc/port_pair_groups", {"port_pairs": [pair2["id"]], "project_id": "p2"})
    other = api.post("/ports", {"network_id": api.p2["id"], "name": "src2", "node": "c2", "interface_name": "src2"})
    fc2 = api.post("/sfc/flow_classifiers", {"logical_source_port": other["id"], "protocol": "tcp",
                                             "project_id": "p2"})
    chain2 = api.post("/sfc/port_chains", {"port_pair_groups": [group2["id"]], "flow_classifiers": [fc2["id"]],
                                           "project_id": "p2"})
    _put(api, {"project_id": "p1", "ingress": 100})

    def hop(chain_id: int) -> int:
        return fr.point_id(fr.CHAIN_HOP, hop_marker(chain_id, 0, 0) & fr.HOP_MASK)
    out = _ingest(api, "c1", [_record(hop(chain["id"]), _ip(vm1), _ip(vm2), 300),
                              _record(hop(chain2["id"]), _ip(vm3), _ip(vm2)),       # p2's chain: nothing on c1
                              _record(fr.point_id(fr.CHAIN_HOP, 5), _ip(vm1), _ip(vm2))])   # not a hop marker
    assert out["accepted"] == 1 and out["refused_by_reason"] == {"not_this_node": 1, "point": 1}
    assert _ingest(api, "c2", [_record(hop(chain["id"]), _ip(vm1), _ip(vm2))])["accepted"] == 1   # fw's node
    recs = api.get("/flow-records", chain=chain["id"], headers=MEMBER)["records"]
    assert len(recs) == 2 and {r["node"] for r in recs} == {"c1", "c2"}
    assert all(r["kind"] == "chain-hop" and r["project"] == "p1" and r["rate"] == 100 and
               r["chain"] == {"id": chain["id"], "direction": 0, "group_index": 0} for r in recs)
    assert {r["port"] for r in recs} == {"vm1", None}        # c1: vm1 sent it into the chain
    assert {(r["bytes"], r["sampled_packets"]) for r in recs} == {(15000, 3), (15000, 0)}
    assert api.get("/flow-records", chain=chain["id"], headers=OTHER)["records"] == []


def test_the_agent_delivers_its_intervals_packed(api, monkeypatch):
    """The agent's collector posts an interval in batches (two of at most 2 records here) with its
    token; the controller files what names the node's own ports and refuses the rest."""
    from fastapi.testclient import TestClient

    import fathom.agent.flow_records as agent_flow_records
    monkeypatch.setattr(agent_flow_records, "BATCH", 2)
    c = FlowRecords(TestClient(api.app, headers=headers_for(api.app, "admin", ("agent",), node="c1")), port=0)
    c.sock.close()
    vm1, vm2 = api.vm1, api.vm2
    for sport in range(3):
        c.agg.add({"point": fr.point_id(fr.PORT_INGRESS, vm1["id"]), "src": _ip(vm1), "dst": _ip(vm2), "proto": 17,
                   "sport": sport, "dport": 53, "packets": 1, "bytes": 100}, 1.0)
    c.agg.add({"point": fr.point_id(fr.PORT_INGRESS, vm2["id"]), "src": _ip(vm2), "dst": _ip(vm1)}, 1.0)  # on c2
    c.close_interval(time.time())
    c.deliver(time.monotonic())
    assert (c.counters["delivered"], c.counters["refused"], c.counters["post_failures"]) == (3, 1, 0)
    assert not c.pending
    recs = api.get("/flow-records", port=vm1["id"])["records"]
    assert sorted(r["sport"] for r in recs) == [0, 1, 2]
    assert all((r["node"], r["port"], r["bytes"], r["first"]) == ("c1", "vm1", 100, 1.0) for r in recs)


def test_tunnel_egress_records_name_the_sender_the_network_and_the_remote_node(api):
    """What left c1 through the tunnel for vm2 (p1, on c2): filed under p1 with vm1 (the c1 port
    holding the source address) as its port, vm2's network and c2 as the remote node, scaled by
    p1's ingress rate. Refused: a sender of another project (p2's vm3 on c1), a source no port of
    the node holds, a point naming a port on the reporting node itself or no port at all."""
    _put(api, {"project_id": "p1", "ingress": 100})
    vm1, vm2, vm3 = api.vm1, api.vm2, api.vm3
    to_vm2, to_vm1 = fr.point_id(fr.TUNNEL_EGRESS, vm2["id"]), fr.point_id(fr.TUNNEL_EGRESS, vm1["id"])
    out = _ingest(api, "c1", [
        _record(to_vm2, _ip(vm1), _ip(vm2), 200),                                 # kept: 2 samples
        _record(to_vm2, _ip(vm3), _ip(vm2)),                                      # p2's port sent it
        _record(to_vm2, "198.19.9.9", _ip(vm2)),                                  # no port of c1 sent it
        _record(to_vm1, _ip(vm1), _ip(vm1)),                                      # vm1 is on c1: no tunnel
        _record(fr.point_id(fr.TUNNEL_EGRESS, 999999), _ip(vm1), _ip(vm2)),       # no such port
    ])
    assert out["accepted"] == 1 and out["refused_by_reason"] == {
        "other_project": 1, "not_this_node": 1, "not_remote": 2}
    # c2 cannot report what vm1 (on c1) sent through its tunnel
    assert _ingest(api, "c2", [_record(to_vm1, _ip(vm1), _ip(vm2))])["refused_by_reason"] == {"not_this_node": 1}
    (rec,) = api.get("/flow-records", kind="tunnel-egress", headers=MEMBER)["records"]
    assert (rec["node"], rec["project"], rec["port"], rec["port_id"], rec["network_id"], rec["remote_node"]) == (
        "c1", "p1", "vm1", vm1["id"], vm2["network_id"], "c2")
    assert (rec["rate"], rec["packets"], rec["sampled_packets"], rec["point"]) == (100, 200, 2, to_vm2)
    assert api.get("/flow-records", remote_node="c2", headers=MEMBER)["records"] == [rec]
    assert api.get("/flow-records", remote_node="c1", headers=MEMBER)["records"] == []
    assert api.get("/flow-records", kind="tunnel-egress", headers=OTHER)["records"] == []
    # what ports send (top talkers) is port-ingress only: the tunnel's copy is not counted twice
    assert api.get("/flow-records", view="top", headers=MEMBER)["records"] == []
    assert REGISTRY.get_sample_value("fathom_flow_records_refused_total",
                                     {"node": "c1", "reason": "other_project"}) >= 1

"""Captures of a tap's monitor port by its node's agent (POST /v1/taps/{id}/capture): who may ask,
the bounds on the request and on the agent's answer, the request handed to the agent with its
long-poll and its answer taken (the agent's own Follower and Capturer over a real store), pcap files
cut at a record's end. The capture on real switches and tcpdump: tests/lab/test_console.py."""
from __future__ import annotations

import base64
import struct
import tempfile
import time

import pytest
from fastapi.testclient import TestClient

from fathom.agent.capture import Capturer, whole_records
from fathom.agent.follow import Follower
from fathom.agent.local import LocalOvs
from fathom.api.agent_captures import MAX_BYTES
from fathom.api.app import create_app

from .agent_loop import agent_polling
from .auth import headers_for


def pcap(*sizes: int) -> bytes:
    """A microsecond pcap file (little-endian) with one record per size."""
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for n in sizes:
        out += struct.pack("<IIII", 1, 0, n, n) + bytes(n)
    return out


def test_a_pcap_is_cut_at_a_records_end():
    data = pcap(100, 200, 300)
    assert whole_records(data, len(data)) == (data, 3)
    assert whole_records(data, len(data) - 1) == (pcap(100, 200), 2)
    assert whole_records(data[:-5], 10**6) == (pcap(100, 200), 2)      # a record cut short by tcpdump's end
    assert whole_records(b"\xd4\xc3", 100) == (b"", 0)


@pytest.fixture(scope="module")
def api():
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(f"sqlite:///{tmp}/fathom.db", agent_max_wait=5)
        with TestClient(app) as client:
            admin = headers_for(app)

            def post(path, body):
                r = client.post("/v1" + path, headers=admin, json=body)
                assert r.status_code == 201, r.text
                return r.json()
            post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
            net = post("/networks", {"name": "blue", "project_id": "p1"})
            post("/subnets", {"network_id": net["id"], "cidr": "198.19.1.0/24"})
            for i in (1, 2, 3):
                post("/ports", {"network_id": net["id"], "name": f"vm{i}", "node": "c1", "interface_name": f"vm{i}",
                                "project_id": "p1"})
            post("/ports", {"network_id": net["id"], "name": "loose", "project_id": "p1"})
            tap = post("/taps", {"name": "web", "sender": "vm1", "receiver": "vm2", "monitor": "vm3", "project_id": "p1"})
            loose = post("/taps", {"name": "loose", "sender": "vm1", "receiver": "vm2", "monitor": "loose", "priority": 200,
                                   "project_id": "p1"})
            yield app, client, admin, tap["id"], loose["id"]
        app.state.engine.dispose()


def capture(client, headers, tap_id, **body):
    return client.post(f"/v1/taps/{tap_id}/capture", headers=headers, json=body)


def test_who_may_ask_and_the_bounds(api):
    app, client, admin, tap, loose = api
    other = headers_for(app, "p2", ("member",))
    assert capture(client, other, tap).status_code == 404         # another project's policy does not exist
    for bad in ({"seconds": 0}, {"seconds": 31}, {"max_bytes": MAX_BYTES + 1}, {"count": 0}, {"monitor": "x"},
                {"interface": "eth0"}):
        assert capture(client, admin, tap, **bad).status_code == 422, bad
    r = capture(client, admin, tap, monitor="monitor2")
    assert r.status_code == 422 and "no monitor2 port" in r.text
    r = capture(client, admin, loose)
    assert r.status_code == 409 and "not plugged on a node" in r.text
    r = capture(client, headers_for(app, "p1", ("member",)), tap)     # the policy's project may; its agent is away
    assert r.status_code == 409 and "c1's agent is not connected" in r.text


def test_only_the_nodes_agent_answers_with_a_pcap(api):
    app, client, *_ = api
    agent = headers_for(app, "admin", ("agent",), node="c1")
    path = "/v1/agents/c1/captures/1"
    assert client.post(path, headers=headers_for(app, "admin", ("agent",), node="c2"),
                       json={"error": "x"}).status_code == 403
    assert client.post(path, headers=headers_for(app), json={"error": "x"}).status_code == 403   # an admin is no agent
    for bad in ("not base64!", base64.b64encode(b"GIF89a" + bytes(40)).decode(),
                base64.b64encode(pcap(MAX_BYTES)).decode()[:(MAX_BYTES + 2) // 3 * 4]):
        assert client.post(path, headers=agent, json={"pcap": bad}).status_code == 422
    r = client.post(path, headers=agent, json={"pcap": base64.b64encode(pcap(60)).decode()})
    assert r.status_code == 404 and "waits for an answer" in r.text          # nobody asked


def test_the_agent_is_asked_and_its_answer_returned(api, tmp_path):
    app, client, admin, tap, _ = api
    agent = TestClient(app, headers=headers_for(app, "admin", ("agent",), node="c1"))
    answers = TestClient(app, headers=headers_for(app, "admin", ("agent",), node="c1"))
    # the agent's own loop and capturer; its OVS is not there (no database socket): vm3 is no port of its br-int
    ovs = LocalOvs(f"unix:{tmp_path}/db.sock")
    follower = Follower(agent, "c1", [], lambda: {}, capturer=Capturer(ovs, answers, "c1"))
    with agent_polling(follower):
        started = time.monotonic()
        r = capture(client, admin, tap, seconds=1)
        assert time.monotonic() - started < 5
    assert r.status_code == 409 and "c1's agent could not capture: vm3 is not a port of this node's br-int" in r.text
    # and what the capturer refuses by itself
    for bad in ({"interface": "vm3;reboot"}, {"seconds": 60}, {"max_bytes": 10 * MAX_BYTES}, {"count": -1}):
        ask = {"id": 1, "interface": "vm3", "seconds": 1, "max_bytes": 4096, "count": None, **bad}
        assert "out of bounds" in Capturer(ovs, answers, "c1").run(ask)["error"]

"""Flow records forwarded to an external IPFIX collector: a real pmacct `nfacctd` on the loopback
(its print plugin writes JSON) receives what the controller filed, and its 5-tuples, packets and
bytes are those `GET /v1/flow-records` reports; the export is an admin's to set, and bounded."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import Counter

import pytest

from fathom import programs
from fathom.agent.ipfix import Reader
from fathom.api import flow_export
from fathom.model import flow_records as fr

from .test_api import MEMBER
from .test_cli_resources import run  # noqa: F401 - the in-process CLI fixture
from .test_flow_records import _ingest, _ip, _put, _record, api  # noqa: F401 - the API fixture

NFACCTD = """daemonize: false
nfacctd_ip: 127.0.0.1
nfacctd_port: {port}
plugins: print[out]
aggregate[out]: src_host, dst_host, src_port, dst_port, proto
print_output[out]: json
print_num_protos[out]: true
print_output_file[out]: {out}
print_output_file_append[out]: true
print_refresh_time[out]: 1
"""


def _listening(port: int) -> bool:
    return any(int(line.split()[1].split(":")[1], 16) == port
               for line in open("/proc/net/udp").read().splitlines()[1:])


@pytest.fixture
def nfacctd(tmp_path):
    """nfacctd on a free loopback UDP port, its print plugin appending JSON to a file every second."""
    binary = programs.path("nfacctd")
    assert binary, programs.missing_message("nfacctd")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "nfacctd.json"
    (tmp_path / "nfacctd.conf").write_text(NFACCTD.format(port=port, out=out))
    proc = subprocess.Popen([binary, "-f", str(tmp_path / "nfacctd.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)   # its plugins: one group
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            assert proc.poll() is None and time.monotonic() < deadline, "nfacctd did not start"
            time.sleep(0.05)
        yield port, out
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # nothing of its output is wanted any more
        proc.wait(timeout=10)


def _sums(rows, keys) -> Counter:
    out: Counter = Counter()
    for r in rows:
        k = tuple(r[n] for n in keys)
        out[k + ("packets",)] += r["packets"]
        out[k + ("bytes",)] += r["bytes"]
    return out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)      # the export does not read the store
def test_nfacctd_receives_what_the_api_reports(api, nfacctd):  # noqa: F811
    port, out = nfacctd
    r = api.http.put("/v1/flow-records/export", json={"host": "127.0.0.1", "port": port}, headers=api.who(None))
    assert r.status_code == 200 and r.json()["host"] == "127.0.0.1", r.text
    _put(api, {"project_id": "p1", "ingress": 100, "drop": 1})
    vm1, vm2 = api.vm1, api.vm2
    sent = fr.point_id(fr.PORT_INGRESS, vm1["id"])
    records = [{**_record(sent, _ip(vm1), _ip(vm2), packets=i + 1, bytes_=1500 * (i + 1)), "sport": 30000 + i,
                "proto": 17 if i % 2 else 6} for i in range(150)]            # several messages
    records += [{**_record(sent, _ip(vm1), _ip(vm2), 3, 252), "proto": 1, "sport": 8, "dport": 0},   # ICMP echo
                _record(fr.point_id(fr.DROP_EGRESS, vm1["id"]), _ip(vm1), _ip(vm2), 2, 120, 22),
                _record(fr.point_id(fr.PORT_INGRESS, vm2["id"]), _ip(vm2), _ip(vm1))]    # refused: vm2 is on c2
    assert _ingest(api, "c1", records)["accepted"] == 152
    reported = api.get("/flow-records", limit=1000)["records"]
    assert len(reported) == 152
    keys = ("src", "dst", "sport", "dport", "proto")
    want = _sums(reported, keys)

    def got() -> Counter:
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        return _sums([{"src": r["ip_src"], "dst": r["ip_dst"], "sport": r["port_src"], "dport": r["port_dst"],
                       "proto": int(r["ip_proto"]), "packets": r["packets"], "bytes": r["bytes"]} for r in rows], keys)
    deadline = time.monotonic() + 15
    while got() != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got() == want
    assert api.get("/flow-records/export")["sent"]["records"] >= 152
    assert api.get("/flow-records/export")["sent"]["errors"] == 0
    # off: nothing further leaves
    assert api.http.delete("/v1/flow-records/export", headers=api.who(None)).json()["host"] is None
    before = api.get("/flow-records/export")["sent"]["records"]
    _ingest(api, "c1", records[:3])
    assert api.get("/flow-records/export")["sent"]["records"] == before


def test_export_is_an_admins_and_bounded(api):  # noqa: F811
    for body, who, status in [
        ({"host": "127.0.0.1", "port": 4739}, MEMBER, 403),        # admins only
        ({"host": "collector.example", "port": 4739}, None, 422),  # an address, not a name
        ({"host": "0.0.0.0", "port": 4739}, None, 422),
        ({"host": "224.0.0.9", "port": 4739}, None, 422),
        ({"host": "127.0.0.1", "port": 0}, None, 422),
        ({"host": "127.0.0.1", "port": 70000}, None, 422),
        ({"host": "127.0.0.1", "port": 4739, "via": "tcp"}, None, 422),
    ]:
        r = api.http.put("/v1/flow-records/export", json=body, headers=api.who(who))
        assert r.status_code == status, (body, r.text)
    assert api.http.get("/v1/flow-records/export", headers=api.who(MEMBER)).status_code == 403
    assert api.http.delete("/v1/flow-records/export", headers=api.who(MEMBER)).status_code == 403
    assert api.get("/flow-records/export")["host"] is None
    r = api.http.put("/v1/flow-records/export", json={"host": "::1", "port": 4739}, headers=api.who(None))
    assert r.status_code == 200 and api.get("/flow-records/export")["host"] == "::1"


def test_messages_are_bounded_and_read_back():
    """Each message stands alone (its templates first), fits MESSAGE_MAX, and fathom's own IPFIX
    reader reads back every record, IPv4 and IPv6."""
    recs = [{"src": "198.19.1.1" if i % 3 else "fd00::1", "dst": "198.19.1.2" if i % 3 else "fd00::2",
             "proto": 17, "sport": i, "dport": 53, "packets": i, "bytes": 100 * i, "first": 1.0, "last": 2.0,
             "point": fr.point_id(fr.PORT_INGRESS, 5)} for i in range(500)]
    msgs = flow_export.messages(recs, 7, 0)
    assert all(len(m) <= flow_export.MESSAGE_MAX for m in msgs) and len(msgs) > 10
    back = [r for m in msgs for r in Reader().read(m).records]
    assert sorted((r["src"], r["sport"], r["packets"], r["bytes"], r["point"]) for r in back) == sorted(
        (r["src"], r["sport"], r["packets"], r["bytes"], r["point"]) for r in recs)


def test_the_cli_sets_shows_and_stops_the_export(run):  # noqa: F811
    shown = json.loads(run("flow-records", "export", "--collector", "[::1]:9995", "--json").output)
    assert (shown["host"], shown["port"]) == ("::1", 9995)
    assert "127.0.0.1:4739" in run("flow-records", "export", "--collector", "127.0.0.1:4739").output
    assert run("flow-records", "export", "--collector", "127.0.0.1", ok=False).output.startswith("error:")
    assert json.loads(run("flow-records", "export", "--off", "--json").output)["host"] is None
    assert "off" in run("flow-records", "export").output

"""`fathom bench trace --live N`: the live trace on a lab (fathom.trace.live) — how long it takes
to answer, and how its kernel times per hop compare with tcpdump's at the same interfaces.

The default lab under its controller; N live traces vm1 → vm3 (compute1 → compute2 over VXLAN)
one after another, each timed from the client (the HTTP round trip included), while tcpdump
(nanosecond software timestamps) captures at the four interfaces the probe crosses: vm1 and ul0
on compute1, ul0 and vm3 on compute2. Each probe is found in the captures by its ICMP identifier
and sequence number (inside VXLAN on ul0); each segment between two consecutive interfaces —
compute1's switches, the underlay, compute2's switches — is timed by both, and the difference is
reported. The two do not stamp at the same instant: on send tcpdump's tap runs just after TC egress;
on receive the kernel stamps the frame for tcpdump when the veth queues it to the receiving side's
backlog (netif_rx), and TC ingress runs when the backlog is processed — the wait between the two,
a few µs on a quiet machine, tens on a loaded one, is the disagreement.
Target: answer ≤ 1 s; per-hop times within 20 µs of tcpdump's, p50.
"""
from __future__ import annotations

import struct
import tempfile
import time
from pathlib import Path

from fathom.bench.report import busy, dist, environment, machine_activity
from fathom.client import Client
from fathom.lab.capture import Capture, read_pcap_ns
from fathom.lab.lab import Lab
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).resolve().parents[1] / "lab" / "topologies" / "default.yaml"
PATH = (("compute1", "vm1"), ("compute1", "ul0"), ("compute2", "ul0"), ("compute2", "vm3"))
TARGET_ANSWER_MS, TARGET_AGREEMENT_US = 1000.0, 20.0


def probe_of(frame: bytes) -> tuple[int, int, int] | None:
    """(ICMP type, identifier, sequence) of an ICMP echo in a frame (plain, VLAN-tagged or in VXLAN)."""
    off, inner = 12, False
    while True:
        if len(frame) < off + 2:
            return None
        (eth_type,) = struct.unpack_from("!H", frame, off)
        if eth_type in (0x8100, 0x88A8):
            off += 4
            continue
        if eth_type != 0x0800 or len(frame) < off + 22:
            return None
        ip = off + 2
        ihl, proto = (frame[ip] & 0xF) * 4, frame[ip + 9]
        l4 = ip + ihl
        if proto == 17 and not inner and len(frame) >= l4 + 16 and struct.unpack_from("!H", frame, l4 + 2)[0] == 4789:
            off, inner = l4 + 16 + 12, True          # the VXLAN payload's Ethernet type
            continue
        if proto != 1 or len(frame) < l4 + 8:
            return None
        return frame[l4], *struct.unpack_from("!HH", frame, l4 + 4)


def run(samples: int = 20, lab_name: str = "tftl", progress=lambda msg: None) -> dict:
    env = environment()
    activity = [machine_activity(("fathom bench trace",))]
    lab = Lab(lab_name)
    lab.down()
    try:
        progress("bringing up the default lab")
        state = lab.up(load(str(TOPOLOGY)), str(TOPOLOGY))
        api = Client.for_lab(state, timeout=60)
        vm1, vm3 = api.find("ports", "vm1")["id"], api.find("ports", "vm3")["id"]
        api.wait_status("ports", vm3, "active", timeout=60)
        with tempfile.TemporaryDirectory() as tmp:
            caps = {(n, d): Capture(lab.ns(n), d, Path(tmp) / f"{n}-{d}.pcap", "icmp or udp port 4789", nano=True)
                    for n, d in PATH}
            for c in caps.values():
                c.start()
            answers, results = [], []
            try:
                progress(f"{samples} live traces vm1 → vm3")
                for _ in range(samples):
                    t0 = time.perf_counter()
                    results.append(api.post("/traces", json={"port_id": vm1, "to_port_id": vm3, "live": True}))
                    answers.append((time.perf_counter() - t0) * 1000)
            finally:
                for c in caps.values():
                    c.stop()
            seen = {}                   # (node, dev) -> {(id, seq): tcpdump's time of the request}
            for key, c in caps.items():
                seen[key] = {}
                for ts, frame in read_pcap_ns(c.path):
                    p = probe_of(frame)
                    if p is not None and p[0] == 8:
                        seen[key].setdefault(p[1:], ts)
    finally:
        lab.down()
    activity.append(machine_activity(("fathom bench trace",)))
    segments: dict[str, dict[str, list]] = {}
    verdicts: dict[str, int] = {}
    for r in results:
        verdicts[r["verdict"]["result"]] = verdicts.get(r["verdict"]["result"], 0) + 1
        probe = (r["live"]["probe"]["icmp_id"], r["live"]["probe"]["icmp_seq"])
        ours = {(p["node"], p["dev"]): p["ktime_ns"] for p in r["live"]["points"]
                if p["icmp_type"] == 8 and p["dir"] != "injected"}
        for a, b in zip(PATH, PATH[1:]):
            if a not in ours or b not in ours or probe not in seen[a] or probe not in seen[b]:
                continue
            name = f"{a[1]}@{a[0]} → {b[1]}@{b[0]}"
            live_us, dump_us = (ours[b] - ours[a]) / 1000, (seen[b][probe] - seen[a][probe]) / 1000
            s = segments.setdefault(name, {"live_us": [], "tcpdump_us": [], "difference_us": []})
            s["live_us"].append(live_us)
            s["tcpdump_us"].append(dump_us)
            s["difference_us"].append(abs(live_us - dump_us))
    return {"benchmark": "trace-live", "plan": {"samples": samples, "topology": str(TOPOLOGY), "path": PATH},
            "answer_ms": dist(answers), "verdicts": verdicts,
            "stages_ms": dist([r["live"]["timings_ms"]["stages"] for r in results]),
            "segments": {k: {m: dist(v) for m, v in s.items()} for k, s in segments.items()},
            "targets": {"answer_ms": TARGET_ANSWER_MS, "agreement_us_p50": TARGET_AGREEMENT_US},
            "busy_machine": busy(activity), "environment": {**env, "machine": activity}}


def markdown(doc: dict) -> str:
    a = doc["answer_ms"]
    rows = [f"| {name} | {s['live_us']['p50']:.1f} | {s['tcpdump_us']['p50']:.1f} | {s['difference_us']['p50']:.1f} "
            f"| {s['difference_us']['p99']:.1f} | {s['difference_us']['n']} |" for name, s in doc["segments"].items()]
    worst = max((s["difference_us"]["p50"] for s in doc["segments"].values()), default=float("inf"))
    return "\n".join([
        f"# fathom bench trace --live: {doc['plan']['samples']} live traces vm1 → vm3 (default lab, VXLAN)",
        "",
        f"Answer (client, HTTP included): p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms, max {a['max']:.0f} ms; "
        f"of which the stages (ofproto/trace per switch) p50 {doc['stages_ms']['p50']:.0f} ms. "
        f"Verdicts {doc['verdicts']}.",
        "",
        "| segment | live p50 µs | tcpdump p50 µs | |live − tcpdump| p50 µs | p99 µs | n |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Targets: answer ≤ {doc['targets']['answer_ms']:g} ms p50: {'met' if a['p50'] <= doc['targets']['answer_ms'] else 'NOT met'}; "
        f"per-hop agreement ≤ {doc['targets']['agreement_us_p50']:g} µs p50: "
        f"{'met' if worst <= doc['targets']['agreement_us_p50'] else 'NOT met'}"
        + (" (busy machine: load average above 1 or other labs running)" if doc["busy_machine"] else ""),
        ""])

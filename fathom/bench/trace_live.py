"""`fathom bench trace --live N [--iperf]`: the live trace on a lab (fathom.trace.live) — how long it
takes to answer, how its kernel times per hop compare with tcpdump's at the same interfaces, and
(with `--iperf`) whether it takes anything from other traffic on its path.

The default lab under its controller; N live traces vm1 → vm3 (compute1 → compute2 over VXLAN)
one after another, each timed from the client (the HTTP round trip included), while tcpdump
(nanosecond software timestamps) captures at the four interfaces the probe crosses: vm1 and ul0
on compute1, ul0 and vm3 on compute2. Each probe and its reply are found in the captures by the
ICMP identifier and sequence number (inside VXLAN on ul0).

What each clock reads. The trace stamps at TC ingress and TC egress (bpf_ktime_get_ns). tcpdump's
stamp of a sent frame is taken as the frame passes the capture tap, on the same transmit path just
after TC egress: a little later, by the trace program's own report (its ring buffer wakes the
watcher) and any capture tap ahead of tcpdump's. tcpdump's stamp of a
received frame is the kernel's receive stamp (`netif_rx`, `net.core.netdev_tstamp_prequeue`=1,
the default), taken when the sending veth queues the frame to the receiving side's backlog; TC
ingress runs when the backlog is processed, after the capture taps (tcpdump's, and OVS's own packet
socket). So the stamps are compared three ways:

- per point: the trace's stamp minus tcpdump's at the same interface, direction and packet, both
  on the real-time clock (the trace's by its agent's monotonic-to-real-time offset): a little
  below 0 at egress, the backlog wait at ingress;
- like for like: the time between two egress points (both clocks read as the frame is sent):
  compute1's underlay port → vm3 (the underlay and compute2's switches), vm3 → compute2's
  underlay port (vm3 answering, compute2's switches for the reply). The target (within 20 µs of
  tcpdump's, p50) is judged on these;
- per hop (each segment between consecutive points, ingress → egress of a node's switches,
  egress → ingress of the underlay): one end of each is an ingress stamp, so tcpdump's time and
  the trace's differ by that end's backlog wait; shown for what it is.

With `--iperf`, whether a live trace adds anything to other traffic: iperf3 TCP vm1 → vm3 (the
probe's own path) for `seconds` (after one omitted second), in `pairs` interleaved pairs of runs
with live traces back to back throughout (`on`) and without (`off`), the order alternating per
pair (on/off, off/on, …) so that drift hits both alike, and more pairs until N traces have run
during `on` runs. The figure is the median of the pairs' on/off ratios with a distribution-free
interval and whether it shows the 0.99 target, refutes it or cannot tell; beside it the noise
floor: how much consecutive `off` runs differ from one another with nothing changed (median and
largest |1 − off₂/off₁|). A ratio within 1 % is resolvable only when that floor is below 1 %.
Where a trace's CPU goes: the CPU time (/proc/PID/stat) of the lab's processes over the N traces,
per trace, by role: the controller (in a real cloud on a host of its own), and on the nodes each
agent itself, the commands it runs (ovs-vsctl, ovs-appctl ofproto/trace), its trace watcher
(livetrace-watch, kept between traces), ovsdb-server and ovs-vswitchd — the hosts' share is what
a trace takes from the datapath on a host. The same roles' CPU per second with no trace
(`cpu_ms_per_s_at_rest`, read before the first) is the lab's own background, part of each figure.

With `--iperf`, also what live traces cost the traffic itself, resolvable where the ratio above is
not (fathom.bench.datapath_cpu): iperf3 TCP vm1 → vm3 at a fixed rate well below saturation in
interleaved on/off pairs (each `off` run starts once the watchers have ended, so that it has no
trace machinery at all, and is followed by one at full speed), and ovs-vswitchd's CPU per GB
carried on the path (compute1's, the fabric's and compute2's switches, by thread kind): what the
traces add to the nodes' switches (the watchers' programs on the interfaces they read and write,
the probe's upcall, any revalidation), read against the fabric's switch (no watcher there; the
probe is one packet of thousands) as the control, against what 0.99 allows a saturated CPU-bound
datapath. The control also takes out what the traces' own CPU does to every switch alike by
competing for the same two cores (a real host runs those elsewhere or on other cores). The
traces' own work (controller, agents, their commands, watchers, ovsdb-server: on a real host
other cores, or another host) is reported apart, per trace, less what the same processes spend
per second in the `off` runs.

Targets: answer ≤ 1 s; per-hop times within 20 µs of tcpdump's, p50; iperf3 on / off ≥ 0.99.
"""
from __future__ import annotations

import os
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

from fathom.bench import datapath_cpu
from fathom.bench.report import busy, dist, environment, machine_activity
from fathom.bench.sfc import median_ci, verdict
from fathom.client import Client
from fathom.host import iperf
from fathom.lab.capture import Capture, read_pcap_ns
from fathom.lab.lab import Lab
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).resolve().parents[1] / "lab" / "topologies" / "default.yaml"
PATH = (("compute1", "vm1"), ("compute1", "ul0"), ("compute2", "ul0"), ("compute2", "vm3"))
VM3_IP = "198.19.1.13"
TARGET_ANSWER_MS, TARGET_AGREEMENT_US, TARGET_RATIO = 1000.0, 20.0, 0.99
PAIRS, IPERF_SECONDS, MAX_PAIRS, CI_LEVEL = 5, 10, 50, 0.95
REST_SECONDS = 5                # the lab's CPU at rest is read over this long before the traces


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


def run(samples: int = 20, lab_name: str = "tftl", progress=lambda msg: None, with_iperf: bool = False,
        pairs: int = PAIRS, seconds: float = IPERF_SECONDS, rate_mbps: float = datapath_cpu.RATE_MBPS,
        cost_pairs: int = datapath_cpu.REPEATS, cost_seconds: float = datapath_cpu.SECONDS) -> dict:
    env = environment()
    activity = [machine_activity(("fathom bench trace",))]
    lab = Lab(lab_name)
    lab.down()
    throughput = cost = None
    try:
        progress("bringing up the default lab")
        state = lab.up(load(str(TOPOLOGY)), str(TOPOLOGY))
        api = Client.for_lab(state, timeout=60)
        vm1, vm3 = api.find("ports", "vm1")["id"], api.find("ports", "vm3")["id"]
        api.wait_status("ports", vm3, "active", timeout=60)
        body = {"port_id": vm1, "to_port_id": vm3, "live": True}
        with tempfile.TemporaryDirectory() as tmp:
            caps = {(n, d): Capture(lab.ns(n), d, Path(tmp) / f"{n}-{d}.pcap", "icmp or udp port 4789", nano=True)
                    for n, d in PATH}
            for c in caps.values():
                c.start()
            answers, results = [], []
            try:
                at_rest = cpu_by_role(lab.dir)           # the lab's own background, before any trace
                time.sleep(REST_SECONDS)
                at_rest = per_trace(at_rest, cpu_by_role(lab.dir), REST_SECONDS)
                progress(f"{samples} live traces vm1 → vm3")
                api.post("/traces", json=body)          # the watchers started: what traces after it cost
                before = cpu_by_role(lab.dir)
                for _ in range(samples):
                    t0 = time.perf_counter()
                    results.append(api.post("/traces", json=body))
                    answers.append((time.perf_counter() - t0) * 1000)
                cpu = per_trace(before, cpu_by_role(lab.dir), samples)
            finally:
                for c in caps.values():
                    c.stop()
            seen = {}                   # (node, dev, ICMP type) -> {(id, seq): tcpdump's time}
            for (node, dev), c in caps.items():
                for ts, frame in read_pcap_ns(c.path):
                    p = probe_of(frame)
                    if p is not None:
                        seen.setdefault((node, dev, p[0]), {}).setdefault(p[1:], ts)
        if with_iperf:
            throughput = _throughput(api, lab, body, samples, pairs, seconds, progress)
            cost = _datapath_cost(api, lab, body, cost_pairs, cost_seconds, rate_mbps, progress)
    finally:
        lab.down()
    activity.append(machine_activity(("fathom bench trace",)))
    verdicts: dict[str, int] = {}
    for r in results:
        verdicts[r["verdict"]["result"]] = verdicts.get(r["verdict"]["result"], 0) + 1
    doc = {"benchmark": "trace-live", "plan": {"samples": samples, "topology": str(TOPOLOGY), "path": PATH},
           "answer_ms": dist(answers), "verdicts": verdicts,
           "stages_ms": dist([r["live"]["timings_ms"]["stages"] for r in results]),
           "cpu_ms_per_trace": cpu, "cpu_ms_per_s_at_rest": at_rest,
           **compare(results, seen),
           "targets": {"answer_ms": TARGET_ANSWER_MS, "agreement_us_p50": TARGET_AGREEMENT_US,
                       "judged_on": "egress_segments", "iperf_on_off_ratio": TARGET_RATIO},
           "busy_machine": busy(activity), "environment": {**env, "machine": activity}}
    if throughput is not None:
        doc["plan"].update(iperf_pairs=pairs, iperf_seconds=seconds)
        doc["iperf"] = throughput
        doc["plan"].update(rate_mbps=rate_mbps, cost_pairs=cost_pairs, cost_seconds=cost_seconds)
        doc["datapath_cost"] = cost
    return doc


ROLES = ("controller", "agent", "agent's commands", "watcher", "ovsdb-server", "ovs-vswitchd")


def _ticks(pid: int) -> tuple[int, int]:
    """(own, reaped children's) CPU ticks of a process."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12]), int(f[13]) + int(f[14])


def cpu_by_role(lab_dir: Path) -> dict[int, tuple[str, int, int]]:
    """The lab's processes (their command line names its directory; a trace watcher is an agent's
    child): pid -> (role, own ticks, reaped children's ticks)."""
    out, agents = {}, set()
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            procs[int(pid)] = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"),
                               int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
        except (OSError, ValueError, IndexError):
            continue
    for pid, (cmd, _) in procs.items():
        if f"{lab_dir}/" not in cmd and not cmd.endswith(str(lab_dir) + " "):
            continue
        role = "controller" if " controller " in cmd else "agent" if " agent run " in cmd else \
            next((r for r in ("ovsdb-server", "ovs-vswitchd") if cmd.startswith(r)), None)
        if role is not None:
            out[pid] = role
            agents.update([pid] if role == "agent" else [])
    out.update({pid: "watcher" for pid, (cmd, ppid) in procs.items() if ppid in agents and "livetrace-watch" in cmd})
    got = {}
    for pid, role in out.items():
        try:
            got[pid] = (role, *_ticks(pid))
        except (OSError, ValueError, IndexError):
            continue
    return got


def per_trace(before: dict, after: dict, n: int, count_new: bool = False) -> dict:
    """CPU ms per trace by role between two `cpu_by_role` readings (processes present in both;
    with `count_new` also those started in between, from zero), with the hosts' share (every role
    but the controller's). Pure."""
    ms = 1000 / os.sysconf("SC_CLK_TCK") / max(n, 1)
    out = {r: 0.0 for r in ROLES}
    for pid, (role, own, children) in after.items():
        was = before.get(pid, (role, 0, 0) if count_new else None)
        if was is not None and was[0] == role:
            out[role] += (own - was[1]) * ms
            if role == "agent":
                out["agent's commands"] += (children - was[2]) * ms
    out = {r: round(v, 2) for r, v in out.items()}
    return {**out, "hosts": round(sum(v for r, v in out.items() if r != "controller"), 2),
            "total": round(sum(out.values()), 2)}


def compare(results: list[dict], seen: dict) -> dict:
    """The trace's stamps against tcpdump's (`seen`: (node, dev, ICMP type) -> {(id, seq): ns}) for
    the probe and its reply: per point (trace − tcpdump, one real-time clock), per segment between
    consecutive egress points (like for like), and per hop (consecutive points, one end an
    ingress stamp). Differences are the trace's time minus tcpdump's, in µs. Pure."""
    points: dict[str, list] = {}
    groups: dict[str, dict[str, dict[str, list]]] = {"egress_segments": {}, "hop_segments": {}}
    for r in results:
        key = (r["live"]["probe"]["icmp_id"], r["live"]["probe"]["icmp_seq"])
        ours = []                       # the trace's points tcpdump saw too: (name, dir, trace ns, tcpdump ns)
        for p in r["live"]["points"]:
            if p["dir"] == "injected" or p.get("icmp_type") not in (0, 8):
                continue
            dump = seen.get((p["node"], p["dev"], p["icmp_type"]), {}).get(key)
            if dump is None:
                continue
            name = f"{p['dev']}@{p['node']} {p['dir']} ({'request' if p['icmp_type'] == 8 else 'reply'})"
            ours.append((name, p["dir"], p["t_ns"], dump))
            points.setdefault(name, []).append((p["t_ns"] - dump) / 1000)
        egress = [o for o in ours if o[1] == "egress"]
        for group, seq in (("egress_segments", egress), ("hop_segments", ours)):
            for a, b in zip(seq, seq[1:]):
                s = groups[group].setdefault(f"{a[0]} → {b[0]}", {"live_us": [], "tcpdump_us": [], "difference_us": []})
                live_us, dump_us = (b[2] - a[2]) / 1000, (b[3] - a[3]) / 1000
                s["live_us"].append(live_us)
                s["tcpdump_us"].append(dump_us)
                s["difference_us"].append(live_us - dump_us)
    out = {"points_us": {name: dist(v) for name, v in points.items()}}
    for group, segs in groups.items():
        out[group] = {name: {**{m: dist(v) for m, v in s.items()},
                             "abs_difference_us": dist([abs(d) for d in s["difference_us"]])}
                      for name, s in segs.items()}
    return out


def _throughput(api: Client, lab: Lab, body: dict, traces: int, pairs: int, seconds: float, progress) -> dict:
    """iperf3 vm1 → vm3 with live traces back to back (`on`) and without (`off`), in interleaved
    pairs, the order alternating; at least `pairs` pairs, more (up to MAX_PAIRS) until `traces`
    traces have run during `on` runs."""
    client, server = lab.ns("vm1"), lab.ns("vm3")
    progress("iperf3 vm1 → vm3: a first run, not counted")
    iperf.iperf3(client, server, VM3_IP, seconds=1)
    runs, order, during, traced = [], [], [], 0
    i = 0
    while i < MAX_PAIRS and (i < pairs or traced < traces):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            progress(f"iperf3 pair {i + 1}, live traces {mode} ({traced} traced so far)")
            gbps, done = _iperf_run(client, server, seconds, (api, body) if mode == "on" else None)
            runs.append(gbps)
            order.append(mode)
            if mode == "on":
                during.append(done)
                traced += done["traces"]
        i += 1
    return {**interleaved(runs, order, TARGET_RATIO), "traces_per_on_run": during, "traces": traced}


def _iperf_run(client: str, server: str, seconds: float, tracing: tuple[Client, dict] | None) -> tuple[float, dict]:
    """One iperf3 TCP run (one second omitted, then `seconds`); with `tracing` live traces one
    after another until it ends. Its Gb/s, and the traces that ended while it ran and their verdicts."""
    got: list = []

    def measure():
        try:
            got.append(iperf.iperf3(client, server, VM3_IP, seconds=seconds, omit=1))
        except Exception as e:          # noqa: BLE001 — handed to the caller below
            got.append(e)
    t = threading.Thread(target=measure)
    t.start()
    done = _traces_while(*tracing, t.is_alive) if tracing is not None else {"traces": 0, "verdicts": {}}
    t.join()
    if isinstance(got[0], Exception):
        raise got[0]
    return got[0].gbps, done


def _traces_while(api: Client, body: dict, running) -> dict:
    """Live traces one after another while `running()`: how many ended while it did, their verdicts."""
    done = {"traces": 0, "verdicts": {}}
    while running():
        r = api.post("/traces", json=body)
        if running():
            done["traces"] += 1
            done["verdicts"][r["verdict"]["result"]] = done["verdicts"].get(r["verdict"]["result"], 0) + 1
    return done


def _no_watchers(lab: Lab, timeout: float = 30.0) -> None:
    """Wait until no trace watcher of the lab runs (they end IDLE seconds after the last trace)."""
    deadline = time.monotonic() + timeout
    while any(role == "watcher" for role, *_ in cpu_by_role(lab.dir).values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"trace watchers still running {timeout:g} s after the last trace")
        time.sleep(0.5)


def _datapath_cost(api: Client, lab: Lab, body: dict, pairs: int, seconds: float, rate_mbps: float,
                   progress) -> dict:
    """iperf3 vm1 → vm3 at `rate_mbps` with live traces back to back (`on`) and without (`off`, no
    watcher left), in `pairs` interleaved pairs, the order alternating: ovs-vswitchd's CPU per GB on
    the path, and every other role's CPU over each run (`roles_ms`)."""
    pids = {n: lab.ovs(n).pid("ovs-vswitchd") for n in ("compute1", "fabric", "compute2")}
    runs = []
    for i in range(pairs):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            if mode == "off":
                _no_watchers(lab)
            progress(f"datapath cost at {rate_mbps:g} Mb/s, pair {i + 1}/{pairs}: live traces {mode}")
            roles = cpu_by_role(lab.dir)
            run = datapath_cpu.run_at_rate(
                lab.ns("vm1"), lab.ns("vm3"), VM3_IP, pids, rate_mbps, seconds,
                alongside=(lambda running: _traces_while(api, body, running)) if mode == "on" else None)
            runs.append({"mode": mode, "repeat": i, **run,
                         "roles_ms": per_trace(roles, cpu_by_role(lab.dir), 1, count_new=True)})
            if mode == "off":
                progress(f"pair {i + 1}/{pairs}: off at full speed")
                runs.append({"mode": datapath_cpu.FULL_SPEED, "repeat": i, **datapath_cpu.run_at_rate(
                    lab.ns("vm1"), lab.ns("vm3"), VM3_IP, pids, None, seconds)})
    return {"rate_mbps": rate_mbps, "seconds": seconds, "runs": runs,
            **datapath_cpu.compare(runs, "off", {"on": TARGET_RATIO}, datapath_cpu.FULL_SPEED,
                                   ("compute1", "compute2"), "fabric"),
            "trace_own_work": own_work(runs)}


def own_work(runs: list[dict]) -> dict:
    """The traces' own CPU (every role but ovs-vswitchd, which the CPU per GB covers) per trace: the
    on runs' CPU less what the same roles spent per second of the off runs over as long, over the
    traces that ran. Pure."""
    on = [r for r in runs if r["mode"] == "on"]
    off = [r for r in runs if r["mode"] == "off"]
    traces = sum(r["alongside"]["traces"] for r in on)
    on_s, off_s = sum(r["wall_s"] for r in on), sum(r["wall_s"] for r in off)
    roles = [r for r in ROLES if r != "ovs-vswitchd"]
    out = {}
    for role in roles:
        at_rest = sum(r["roles_ms"][role] for r in off) / off_s if off_s else 0.0
        out[role] = (sum(r["roles_ms"][role] for r in on) - at_rest * on_s) / traces if traces else None
    known = [v for v in out.values() if v is not None]
    return {"cpu_ms_per_trace": out, "total": sum(known) if known else None,
            "hosts": sum(v for r, v in out.items() if r != "controller" and v is not None) if known else None,
            "traces": traces, "traces_per_s": traces / on_s if on_s else None}


def interleaved(runs: list[float], order: list[str], target: float) -> dict:
    """Interleaved on/off runs (`order[i]` the mode of `runs[i]`, taken two by two as pairs): the
    on/off ratio of each pair, their median with a distribution-free interval and whether it shows
    `target` or not; the noise floor, |1 − off₂/off₁| of consecutive off runs (nothing changed
    between them), median and largest; and whether that floor lets the run resolve 1 − target. Pure."""
    pairs = [dict(zip(order[i:i + 2], runs[i:i + 2])) for i in range(0, len(runs) - 1, 2)]
    ratios = [p["on"] / p["off"] for p in pairs if p.get("off") and "on" in p]
    off = [v for m, v in zip(order, runs) if m == "off"]
    drift = [abs(1 - b / a) for a, b in zip(off, off[1:]) if a]
    floor = statistics.median(drift) if drift else None
    resolves = floor is not None and floor < 1 - target
    ci = median_ci(ratios, CI_LEVEL)
    return {"gbps": {"on": [v for m, v in zip(order, runs) if m == "on"], "off": off}, "order": order,
            "pair_ratios": ratios, "pair_ratio": dist(ratios),
            "pair_ratio_median": statistics.median(ratios) if ratios else None,
            "pair_ratio_ci": ci, "ci_level": CI_LEVEL, "verdict": verdict(ci, target), "target": target,
            "noise_floor": {"off_off_change": drift, "median": floor, "max": max(drift) if drift else None},
            "resolves_target": resolves,
            "note": f"consecutive off runs differ by {floor:.2%} (median): "
                    f"{'below' if resolves else 'not below'} the {1 - target:.0%} the target asks to resolve"
            if floor is not None else "too few off runs to tell the noise floor"}


def markdown(doc: dict) -> str:
    a = doc["answer_ms"]

    def rows(group):
        return [f"| {name} | {s['live_us']['p50']:.1f} | {s['tcpdump_us']['p50']:.1f} | {s['difference_us']['p50']:+.1f} "
                f"| {s['abs_difference_us']['p50']:.1f} | {s['abs_difference_us']['p99']:.1f} | {s['difference_us']['n']} |"
                for name, s in doc[group].items()]
    head = ["| segment | live p50 µs | tcpdump p50 µs | live − tcpdump p50 µs | |live − tcpdump| p50 µs | p99 µs | n |",
            "|---|---|---|---|---|---|---|"]
    worst = max((s["abs_difference_us"]["p50"] for s in doc["egress_segments"].values()), default=float("inf"))
    busy_note = " (busy machine: load average above 1 or other labs running)" if doc["busy_machine"] else ""
    lines = [
        f"# fathom bench trace --live: {doc['plan']['samples']} live traces vm1 → vm3 (default lab, VXLAN)",
        "",
        f"Answer (client, HTTP included): p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms, max {a['max']:.0f} ms; "
        f"of which the stages (ofproto/trace per switch, when run) p50 {doc['stages_ms']['p50']:.0f} ms. "
        f"Verdicts {doc['verdicts']}.",
        "",
        "CPU per trace (ms): " + ", ".join(f"{r} {v:.1f}" for r, v in doc.get("cpu_ms_per_trace", {}).items())
        + "; at rest, per second: " + ", ".join(f"{r} {v:.1f}" for r, v in doc.get("cpu_ms_per_s_at_rest", {}).items())
        + ".",
        "",
        "Per point, the trace's stamp − tcpdump's (µs; a little below 0 at egress, the backlog wait at ingress):",
        "",
        "| point | p50 | p90 | p99 | n |", "|---|---|---|---|---|",
        *[f"| {name} | {d['p50']:+.1f} | {d['p90']:+.1f} | {d['p99']:+.1f} | {d['n']} |" for name, d in doc["points_us"].items()],
        "",
        "Like for like, between egress points (both clocks read as the frame is sent):",
        "", *head, *rows("egress_segments"),
        "",
        "Per hop (one end an ingress stamp: tcpdump's is the backlog wait earlier):",
        "", *head, *rows("hop_segments"),
        "",
        f"Targets: answer ≤ {doc['targets']['answer_ms']:g} ms p50: {'met' if a['p50'] <= doc['targets']['answer_ms'] else 'NOT met'}; "
        f"agreement between egress points ≤ {doc['targets']['agreement_us_p50']:g} µs p50: "
        f"{'met' if worst <= doc['targets']['agreement_us_p50'] else 'NOT met'}" + busy_note]
    if "iperf" in doc:
        t, p = doc["iperf"], doc["plan"]
        ci = t["pair_ratio_ci"]
        floor = t["noise_floor"]
        lines += [
            "",
            f"iperf3 TCP vm1 → vm3, {len(t['pair_ratios'])} interleaved pairs of {p['iperf_seconds']:g} s, "
            f"{t['traces']} live traces during the on runs:",
            "",
            "| | on Gb/s p50 | off Gb/s p50 | on/off per pair: median | min | max | interval | verdict |",
            "|---|---|---|---|---|---|---|---|",
            f"| iperf3 | {statistics.median(t['gbps']['on']):.3f} | {statistics.median(t['gbps']['off']):.3f} "
            f"| {t['pair_ratio_median']:.4f} | {t['pair_ratio']['min']:.4f} | {t['pair_ratio']['max']:.4f} "
            f"| {'–' if ci is None else f'{ci[0]:.4f}–{ci[1]:.4f} ({ci[2]:.0%})'} | {t['verdict']} (≥ {t['target']}) |",
            "",
            "Noise floor, |1 − off₂/off₁| of consecutive off runs: "
            + ("–" if floor["median"] is None else f"median {floor['median']:.4f}, max {floor['max']:.4f}")
            + f": {'resolves' if t['resolves_target'] else 'cannot resolve'} a {1 - t['target']:.0%} difference here"
            + busy_note]
    if doc.get("datapath_cost"):
        c, p = doc["datapath_cost"], doc["plan"]
        w = c["trace_own_work"]
        lines += ["", *datapath_cpu.markdown(c, f"iperf3 TCP vm1 → vm3 at {c['rate_mbps']:g} Mb/s for "
                                                f"{c['seconds']:g} s, {p['cost_pairs']} interleaved on/off pairs, "
                                                f"{w['traces']} traces during the on runs"),
                  "", "The traces' own CPU per trace, off runs' rate subtracted (ms): "
                  + ", ".join(f"{r} {'–' if v is None else f'{v:.1f}'}" for r, v in w["cpu_ms_per_trace"].items())
                  + ("" if w["total"] is None else f"; total {w['total']:.1f}, hosts {w['hosts']:.1f}")
                  + ("" if w["traces_per_s"] is None else f"; {w['traces_per_s']:.1f} traces a second") + "."]
    return "\n".join([*lines, ""])

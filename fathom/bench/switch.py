"""`fathom bench switch`: Oflops-style measurements of a switch (papers 003 and 004).

Modules (run in this order; calibration first, as the paper does):
  calibration   the same probes over a direct veth pair: the floor of the measuring system and the
                generator's ceiling (RFC 2544 throughput of the tool itself) per frame size
  action-delay  install one rule (forward, VLAN push, VLAN rewrite, MAC rewrite), send >= 30,000
                frames: latency distribution and loss per action (OpenFlow devices)
  frame-size    latency and loss against frame size at a fixed load (paper: 10 Mb/s)
  load          latency and loss against offered load at 150-byte frames
  throughput    RFC 2544 binary search for the highest zero-loss rate per frame size
  flow-install  flow_mod sent -> first frame forwarded by the new rule, per flow, beside the barrier reply
  packet-in     data-plane frame (kernel TX stamp) -> packet_in at the controller
  echo          OpenFlow echo round trip
  overlay       throughput against frame size through VXLAN between two lab nodes vs the same path on a
                VLAN (the VXLAN paper's Fig. 8), see overlay.py

Latency is kernel TX stamp -> kernel RX stamp of the same frame (SO_TIMESTAMPING, software on veth).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .devices import GEN_PORT, RCV_PORT, Device, OvsDevice, VethDevice, make_device
from .engine import (L1_OVERHEAD, BenchError, engine_args, finish_engine, mbps_for, pps_for, run_engine,
                     start_engine)

MODULES = ("calibration", "action-delay", "frame-size", "load", "throughput", "flow-install", "packet-in",
           "echo", "overlay")
OPENFLOW_MODULES = {"action-delay", "flow-install", "packet-in", "echo"}
GEN_LIMIT = 0.97  # achieved/offered below this: the generator, not the device, set the pace
LAT_KEYS = ("min_ns", "mean_ns", "std_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns")


@dataclass
class Plan:
    quick: bool = True
    sizes: list[int] = field(default_factory=list)
    fixed_load_mbps: float = 10.0
    loads_mbps: list[float] = field(default_factory=list)
    load_size: int = 150
    point_s: float = 1.0
    action_frames: int = 30000
    tput_sizes: list[int] = field(default_factory=list)
    trial_s: float = 0.5
    tput_resolution: float = 0.02
    loss_tolerance: float = 0.0
    flows: int = 50
    flow_probe_pps: float = 50000
    packet_in_frames: int = 1000
    packet_in_pps: float = 500
    echo_count: int = 100
    drop_every: int = 0
    reorder_every: int = 0
    dup_every: int = 0
    spin_us: int = 20  # waits above 20 us are slept (the device needs the CPU), shorter ones spun (even gaps)
    fifo_max_pps: float = 100000  # paced runs up to this rate send from a SCHED_FIFO thread

    @classmethod
    def make(cls, quick: bool, mtu: int, sizes: list[int] | None = None) -> "Plan":
        if quick:
            p = cls(quick=True, sizes=[64, 256, 512, 1024, 1518], loads_mbps=[10, 50, 100, 200, 400],
                    point_s=1.0, tput_sizes=[64, 512, 1518], trial_s=0.5, flows=50, flow_probe_pps=50000,
                    packet_in_frames=1000, echo_count=100)
        else:
            p = cls(quick=False, sizes=[64, 128, 256, 512, 1024, 1280, 1518],
                    loads_mbps=[10, 25, 50, 100, 150, 200, 300, 400, 500, 600], point_s=3.0,
                    tput_sizes=[64, 128, 256, 512, 1024, 1280, 1518], trial_s=2.0, flows=200,
                    flow_probe_pps=100000, packet_in_frames=3000, echo_count=500)
        if mtu > 1500:
            p.sizes.append(mtu + 18)
            p.tput_sizes.append(mtu + 18)
        if sizes:
            p.sizes = sorted(sizes)
            p.tput_sizes = sorted(sizes)
        return p


def _lat(r: dict) -> dict:
    lat = r.get("latency", {})
    return {f"latency_{k}": lat.get(k) for k in LAT_KEYS}


def row_from(r: dict, **extra) -> dict:
    tx, rx = r["tx"], r.get("rx", {})
    size = r["config"]["frame_size_bytes"]
    offered = r["config"]["target_pps"]
    achieved = tx["achieved_pps"]
    row = {**extra, "frame_size_bytes": size, "offered_pps": round(offered, 1),
           "offered_mbps": round(mbps_for(offered, size), 3), "achieved_pps": round(achieved, 1),
           "achieved_mbps": round(mbps_for(achieved, size), 3), "frames_sent": tx["frames"],
           "frames_received": rx.get("unique"), "lost": rx.get("lost"), "loss_ratio": rx.get("loss_ratio"),
           "duplicates": rx.get("duplicates"), "reordered": rx.get("reordered"), "seq_gaps": rx.get("seq_gaps"),
           "rx_pps": rx.get("rx_pps"), "rx_mbps": round(mbps_for(rx.get("rx_pps") or 0, size), 3),
           "latency_n": r.get("latency", {}).get("n"), **_lat(r),
           "generator_limited": bool(offered > 0 and achieved < GEN_LIMIT * offered),
           "tx_lateness_p99_ns": tx["lateness"].get("p99_ns"), "tx_gap_p50_ns": tx["gap"].get("p50_ns"),
           "tx_gap_p99_ns": tx["gap"].get("p99_ns"), "timestamp_source": r.get("timestamp_source")}
    return row


class SwitchBench:
    """Runs the modules against one device at a time and collects rows per module."""

    def __init__(self, plan: Plan, devices: list[str], modules: list[str], mtu: int = 1500,
                 step: Callable[[str], None] = lambda s: None, keep_frames: str | None = None):
        self.plan, self.devices, self.modules, self.mtu, self.step = plan, devices, modules, mtu, step
        self.rows: dict[str, list[dict]] = {m: [] for m in MODULES + ("calibration-throughput",)}
        self.extra: dict = {"devices": {}, "offloads": {}, "flow_dumps": {}}
        self.gen_ceiling: dict[int, float] = {}
        self.keep_frames = keep_frames
        self.validate()

    # ----- checks before anything is built -----
    def validate(self) -> None:
        for d in self.devices:
            make_device(d, self.mtu)  # unknown device / bad MTU raise BenchError
        for m in self.modules:
            if m not in MODULES:
                raise BenchError(f"unknown module {m!r}: choose from {', '.join(MODULES)}")
        max_frame = self.mtu + 18
        for s in set(self.plan.sizes) | set(self.plan.tput_sizes) | {self.plan.load_size}:
            if s < 64:
                raise BenchError(f"frame size {s} is below the Ethernet minimum of 64 bytes")
            if s > max_frame:
                raise BenchError(f"frame size {s} is above the MTU: --mtu {self.mtu} allows frames up to "
                                 f"{max_frame} bytes (use --mtu {s - 18} for jumbo frames)")

    def planned_steps(self) -> int:
        p, n = self.plan, 0
        per_dev = {"frame-size": len(p.sizes), "load": len(p.loads_mbps), "throughput": len(p.tput_sizes),
                   "action-delay": 4, "flow-install": 1, "packet-in": 1, "echo": 1}
        if "calibration" in self.modules:
            n += len(p.sizes) + len(p.loads_mbps) + len(p.tput_sizes)
        for d in self.devices:
            n += 1
            for m in self.modules:
                if m in per_dev and (m not in OPENFLOW_MODULES or d == "ovs" or m == "action-delay"):
                    n += per_dev[m]
        if "overlay" in self.modules:
            n += 2 * len(p.tput_sizes) + 2
        return n

    # ----- engine runs -----
    def _run(self, dev: Device, size: int, pps: float, count: int, **kw) -> dict:
        p = self.plan
        extra = list(kw.pop("extra", [])) + ["--spin-us", str(p.spin_us)]
        if 0 < pps <= p.fifo_max_pps and kw.get("stamp_every", 1):
            extra.append("--fifo")  # latency runs: on-time departures even when the machine is busy
        if p.reorder_every:
            extra += ["--reorder-every", str(p.reorder_every)]
        if p.dup_every:
            extra += ["--dup-every", str(p.dup_every)]
        return run_engine(engine_args(dev.tx, dev.rx, size=size, rate_pps=pps, count=max(int(count), 10),
                                      dst_mac=dev.rx.mac, extra=extra, **kw))

    def _fixed(self, dev: Device, module: str, size: int, mbps: float, seconds: float, **kw) -> dict:
        pps = pps_for(mbps, size)
        key = f"{module}/{dev.name}/{size}B/{mbps:g}Mbps"
        if self.keep_frames:
            Path(self.keep_frames).mkdir(parents=True, exist_ok=True)
            kw["csv"] = str(Path(self.keep_frames) / (key.replace("/", "_") + ".csv"))
        r = self._run(dev, size, pps, pps * seconds, buckets=True, **kw)
        # the log-linear histogram: [lower_ns, width_ns, count] of each non-empty bucket
        self.extra.setdefault("histograms", {})[key] = r.get("latency", {}).pop("buckets", [])
        row = row_from(r, module=module, device=dev.name)
        self.rows[module].append(row)
        return row

    def _search(self, dev: Device, module: str, size: int, ceiling: float | None) -> dict:
        """RFC 2544 throughput: binary search for the highest rate whose loss is within tolerance."""
        p = self.plan
        hi = ceiling or 2e6
        lo, best, trials, first = 0.0, 0.0, [], True
        rate = hi  # first trial at the ceiling: a device as fast as the tool stops there
        while True:
            r = self._run(dev, size, rate, rate * p.trial_s, stamp_every=0, linger_s=0.3)
            ok = (r["rx"]["loss_ratio"] or 0) <= p.loss_tolerance
            trials.append({"offered_pps": round(rate), "achieved_pps": r["tx"]["achieved_pps"],
                           "loss_ratio": r["rx"]["loss_ratio"], "pass": ok})
            if ok:
                lo, best = rate, r["tx"]["achieved_pps"]
            else:
                # the generator never goes faster than it did at the top rate
                hi = min(rate, r["tx"]["achieved_pps"]) if first else rate
            if first and ok:
                break
            first = False
            if hi - lo <= p.tput_resolution * hi or len(trials) >= 12:
                break
            rate = (lo + hi) / 2
        at_ceiling = bool(ceiling and best >= GEN_LIMIT * ceiling)
        row = {"module": module, "device": dev.name, "frame_size_bytes": size,
               "throughput_pps": round(best, 1), "throughput_mbps": round(mbps_for(best, size), 3),
               "line_rate_10g_pps": round(10e9 / ((size + L1_OVERHEAD) * 8), 1),
               "tool_ceiling_pps": round(ceiling, 1) if ceiling else None, "trials": len(trials),
               "trial_s": p.trial_s, "loss_tolerance": p.loss_tolerance,
               "generator_limited": at_ceiling, "search": trials}
        self.rows[module].append(row)
        return row

    # ----- modules -----
    def calibration(self) -> None:
        dev = VethDevice(self.mtu)
        dev.setup()
        try:
            self.extra["devices"]["veth"] = dev.describe()
            self.extra["offloads"]["veth"] = dev.offloads()
            for s in self.plan.sizes:
                self.step(f"calibration: {s} B at {self.plan.fixed_load_mbps:g} Mb/s")
                self._fixed(dev, "calibration", s, self.plan.fixed_load_mbps, self.plan.point_s)
            for mbps in self.plan.loads_mbps:  # paper Fig. 3: the loopback against load
                self.step(f"calibration: {self.plan.load_size} B at {mbps:g} Mb/s")
                self._fixed(dev, "load", self.plan.load_size, mbps, self.plan.point_s)
            for s in self.plan.tput_sizes:
                self.step(f"calibration: tool ceiling at {s} B")
                row = self._search(dev, "calibration-throughput", s, None)
                self.gen_ceiling[s] = row["throughput_pps"] or None
        finally:
            dev.teardown()

    def action_delay(self, dev: Device) -> None:
        p = self.plan
        size = 128  # room for an 802.1Q tag in every variant
        pps = pps_for(p.fixed_load_mbps, size)
        actions = {"forward": ([], None, {}), "vlan-push": ([["push_vlan", 100]], None, {}),
                   "vlan-rewrite": ([["set_vlan", 200]], 10, {"vlan_vid": 10}),
                   "mac-rewrite": ([["set_eth_dst", dev.rx.mac], ["set_eth_src", "02:5b:00:00:00:01"]], None, {})}
        for name, (acts, vlan, match) in actions.items():
            self.step(f"{dev.name}: action delay, {name}")
            if not isinstance(dev, OvsDevice):
                if name != "forward":
                    continue
                install = None
            else:
                install = dev.forward(acts, match)
                self.extra["flow_dumps"][f"{dev.name}/{name}"] = dev.dump_flows()
            r = self._run(dev, size, pps, p.action_frames, vlan=vlan)
            row = row_from(r, module="action-delay", device=dev.name, action=name)
            if install:
                row["barrier_ns"] = install["barrier_reply_ns"] - install["sent_ns"][0]
            self.rows["action-delay"].append(row)

    def frame_size(self, dev: Device) -> None:
        for s in self.plan.sizes:
            self.step(f"{dev.name}: {s} B at {self.plan.fixed_load_mbps:g} Mb/s")
            self._fixed(dev, "frame-size", s, self.plan.fixed_load_mbps, self.plan.point_s)

    def load(self, dev: Device) -> None:
        for mbps in self.plan.loads_mbps:
            self.step(f"{dev.name}: {self.plan.load_size} B at {mbps:g} Mb/s")
            self._fixed(dev, "load", self.plan.load_size, mbps, self.plan.point_s)

    def throughput(self, dev: Device) -> None:
        for s in self.plan.tput_sizes:
            self.step(f"{dev.name}: RFC 2544 throughput at {s} B")
            self._search(dev, "throughput", s, self.gen_ceiling.get(s))

    def flow_install(self, dev: OvsDevice) -> None:
        """Oflops add_flow: probes round-robin over N flows that no rule forwards yet; N flow_mods then a
        barrier; per flow, the first probe seen at the receiver marks the rule active."""
        p = self.plan
        self.step(f"{dev.name}: flow install, {p.flows} flows")
        dev.of({"op": "clear"})
        settle_s, tail_s = 0.8, 1.5
        pps = p.flow_probe_pps
        count = int(pps * (settle_s + tail_s + 0.5))
        proc = start_engine(engine_args(dev.tx, dev.rx, size=64, rate_pps=pps, count=count, dst_mac=dev.rx.mac,
                                        flows=p.flows, stamp_every=0, warmup_s=0.05))
        try:
            time.sleep(settle_s)
            flows = [{"priority": 100, "match": {"in_port": GEN_PORT, "eth_type": 0x0800, "ip_proto": 17,
                                                 "udp_dst": 9000 + i}, "actions": [["output", RCV_PORT]]}
                     for i in range(p.flows)]
            res = dev.flows(flows, barrier=True)
        finally:
            r = finish_engine(proc)
        sent, barrier_reply = res["sent_ns"], res["barrier_reply_ns"]
        resolution_ns = p.flows / pps * 1e9
        for i, (f, t_sent) in enumerate(zip(r["flows"], sent)):
            first = f["first_rx_ns"]
            self.rows["flow-install"].append({
                "module": "flow-install", "device": dev.name, "flow": i, "udp_dst": f["dport"],
                "flow_mod_sent_ns": t_sent, "first_rx_ns": first or None,
                "install_delay_ns": (first - t_sent) if first else None,
                "barrier_delay_ns": barrier_reply - sent[0], "active_before_barrier": bool(first and first < barrier_reply),
                "probe_interval_per_flow_ns": round(resolution_ns), "frames_forwarded": f["frames"]})
        self.extra["flow_install"] = {"flows": p.flows, "probe_pps": pps, "barrier_delay_ns": barrier_reply - sent[0],
                                      "send_span_ns": sent[-1] - sent[0], "probe_interval_per_flow_ns": resolution_ns,
                                      "rx_unique": r["rx"]["unique"]}

    def packet_in(self, dev: OvsDevice) -> None:
        import csv as _csv
        import tempfile
        p = self.plan
        self.step(f"{dev.name}: packet_in latency")
        dev.of({"op": "clear"})
        dev.flows([{"priority": 0, "match": {}, "actions": [["controller"]]}])
        dev.of({"op": "packet_in_start"})
        with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
            r = run_engine(engine_args(dev.tx, None, size=64, rate_pps=p.packet_in_pps, count=p.packet_in_frames,
                                       dst_mac=dev.rx.mac, csv=tmp.name))
            time.sleep(0.5)
            events = dev.of({"op": "packet_in_stop"})["events"]
            tx = {int(row["seq"]): int(row["tx_kernel_ns"]) for row in _csv.DictReader(open(tmp.name))}
        lat, seen = [], set()
        for t, hexdata in events:
            data = bytes.fromhex(hexdata)
            if len(data) < 50 or data[42:46] != b"\xbe\x9b\xe9\x55":
                continue
            seq = int.from_bytes(data[46:50], "big")
            if seq in tx and tx[seq] and seq not in seen:
                seen.add(seq)
                lat.append(t - tx[seq])
        row = {"module": "packet-in", "device": dev.name, "frames_sent": r["tx"]["frames"],
               "packet_ins": len(events), "matched": len(lat),
               "loss_ratio": round(1 - len(lat) / max(1, r["tx"]["frames"]), 6), "offered_pps": p.packet_in_pps,
               "clock": "kernel TX stamp -> time.time_ns() in the os-ken handler", **summarize(lat)}
        self.rows["packet-in"].append(row)
        self.extra["packet_in_latencies_ns"] = lat

    def echo(self, dev: OvsDevice) -> None:
        self.step(f"{dev.name}: echo round trip")
        rtts = dev.of({"op": "echo", "count": self.plan.echo_count})["rtt_ns"]
        self.rows["echo"].append({"module": "echo", "device": dev.name, "count": len(rtts),
                                  "clock": "time.time_ns() send -> reply handler", **summarize(rtts)})

    def run_device(self, name: str) -> None:
        dev = make_device(name, self.mtu)
        self.step(f"{name}: building")
        dev.setup()
        try:
            self.extra["devices"][name] = dev.describe()
            self.extra["offloads"][name] = dev.offloads()
            if self.plan.drop_every:
                dev.drop_every(self.plan.drop_every)
            if isinstance(dev, OvsDevice):
                dev.forward()
            for m in self.modules:
                if m in ("calibration", "overlay"):
                    continue
                if m in OPENFLOW_MODULES - {"action-delay"} and not isinstance(dev, OvsDevice):
                    continue
                getattr(self, m.replace("-", "_"))(dev)
                if isinstance(dev, OvsDevice) and m in ("flow-install", "packet-in"):
                    dev.forward()
            if isinstance(dev, OvsDevice):
                self.extra["flow_dumps"][f"{name}/final"] = dev.dump_flows()
                self.extra["ovs_port_stats"] = dev.port_stats()
        finally:
            dev.teardown()

    def run(self) -> dict:
        if "calibration" in self.modules:
            self.calibration()
        for d in self.devices:
            if d == "veth" and "calibration" in self.modules:
                continue
            self.run_device(d)
        if "overlay" in self.modules:
            from .overlay import run_overlay
            self.rows["overlay"], self.extra["overlay"] = run_overlay(self.plan, self.step)
        return {m: rows for m, rows in self.rows.items() if rows}


def summarize(values: list[int]) -> dict:
    """min/mean/std/percentiles (nearest rank) of a list of ns values."""
    if not values:
        return {f"{k}": None for k in LAT_KEYS} | {"n": 0}
    v = sorted(values)
    n = len(v)

    def q(x):
        return v[min(n - 1, max(0, int(-(-x * n // 1)) - 1))]
    mean = sum(v) / n
    std = (sum((x - mean) ** 2 for x in v) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return {"n": n, "min_ns": v[0], "mean_ns": round(mean, 1), "std_ns": round(std, 1), "p50_ns": q(0.5),
            "p90_ns": q(0.9), "p99_ns": q(0.99), "p999_ns": q(0.999), "max_ns": v[-1]}

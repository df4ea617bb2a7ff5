"""`fathom bench switch`: Oflops-style measurements of a switch (papers 003 and 004).

Modules (run in this order; calibration first, as the paper does):
  calibration   the measuring system on its own: the floor over a direct veth pair (both stamps inside
                one veth_xmit call), the same frames up to the receiving thread, the floor through a
                device that only receives and resends (tc redirect: a receive path), a check of the TX
                stamps against a capture, and the tool's own RFC 2544 ceiling per frame size
  generator     fathom-traffic against trafgen on the same veth, same frames, one core (generator.py)
  action-delay  install one rule (forward, VLAN push, VLAN rewrite, MAC rewrite), send >= 30,000
                frames: latency distribution and loss per action (OpenFlow devices)
  frame-size    latency and loss against frame size at a fixed load (paper: 10 Mb/s)
  load          latency and loss against offered load at 150-byte frames
  throughput    RFC 2544 throughput per frame size (rfc2544.py)
  flow-install  flow_mod on the switch's loopback -> first frame forwarded by the new rule, per flow, on
                one clock (kernel stamps), with probes below the device's zero-loss rate
  packet-in     data-plane frame (kernel TX stamp) -> packet_in at the controller
  echo          OpenFlow echo round trip
  overlay       throughput against frame size through VXLAN between two lab nodes vs the same path on a
                VLAN (the VXLAN paper's Fig. 8), see overlay.py

Latency is kernel TX stamp -> kernel RX stamp of the same frame (SO_TIMESTAMPING, software on veth).
"""
from __future__ import annotations

import csv as csvmod
import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fathom.lab.capture import Capture, read_pcap_ns
from fathom.stats import percentile

from . import generator, rfc2544
from .devices import GEN_PORT, OF_PORT, RCV_PORT, Device, Names, OvsDevice, RedirectDevice, VethDevice, make_device
from .engine import (L1_OVERHEAD, BenchError, engine_args, finish_engine, mbps_for, pps_for, run_engine,
                     start_engine)
from .ofstream import openflow_messages

MODULES = ("calibration", "generator", "action-delay", "frame-size", "load", "throughput", "flow-install",
           "packet-in", "echo", "overlay")
OPENFLOW_MODULES = {"action-delay", "flow-install", "packet-in", "echo"}
GEN_LIMIT = rfc2544.GEN_LIMIT
LAT_KEYS = ("min_ns", "mean_ns", "std_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns")
OFPT_FLOW_MOD, OFPT_BARRIER_REPLY = 14, 21


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
    search: rfc2544.SearchPlan = field(default_factory=rfc2544.SearchPlan)
    tput_repeats: int = 1
    flows: int = 20
    flow_probe_share: float = 0.5  # probes at this share of the zero-loss rate with every flow installed
    packet_in_frames: int = 1000
    packet_in_pps: float = 500
    echo_count: int = 100
    gen_sizes: list[int] = field(default_factory=lambda: [64])
    gen_window_s: float = 2.0
    gen_repeats: int = 3
    drop_every: int = 0
    reorder_every: int = 0
    dup_every: int = 0
    spin_us: int = 20  # waits above 20 us are slept (the device needs the CPU), shorter ones spun (even gaps)
    fifo_max_pps: float = 100000  # paced runs up to this rate send from a SCHED_FIFO thread

    @classmethod
    def make(cls, quick: bool, mtu: int, sizes: list[int] | None = None) -> "Plan":
        if quick:
            # QUICK: RFC 2544 asks for 60 s trials; these are short and labelled so in every report
            p = cls(quick=True, sizes=[64, 256, 512, 1024, 1518], loads_mbps=[10, 50, 100, 200, 400],
                    point_s=1.0, tput_sizes=[64, 512, 1518],
                    search=rfc2544.SearchPlan(trial_s=0.5, final_s=2.0, max_trials=8, resolution=0.05),
                    flows=20, packet_in_frames=1000, echo_count=100, gen_sizes=[64, 1518], gen_window_s=2.0,
                    gen_repeats=3)
        else:
            p = cls(quick=False, sizes=[64, 128, 256, 512, 1024, 1280, 1518],
                    loads_mbps=[10, 25, 50, 100, 150, 200, 300, 400, 500, 600], point_s=3.0,
                    tput_sizes=[64, 128, 256, 512, 1024, 1280, 1518],
                    search=rfc2544.SearchPlan(trial_s=5.0, final_s=rfc2544.RFC_TRIAL_S, max_trials=12,
                                              resolution=0.02),
                    flows=100, packet_in_frames=3000, echo_count=500, gen_sizes=[64, 512, 1518],
                    gen_window_s=5.0, gen_repeats=5)
        if mtu > 1500:
            p.sizes.append(mtu + 18)
            p.tput_sizes.append(mtu + 18)
        if sizes:
            p.sizes = sorted(sizes)
            p.tput_sizes = sorted(sizes)
            p.gen_sizes = sorted(sizes)
        return p

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["search"]["describe"] = self.search.describe()
        return d


def _lat(r: dict, key: str = "latency", prefix: str = "latency") -> dict:
    lat = r.get(key, {})
    return {f"{prefix}_{k}": lat.get(k) for k in LAT_KEYS}


def row_from(r: dict, **extra) -> dict:
    tx, rx = r["tx"], r.get("rx", {})
    size = r["config"]["frame_size_bytes"]
    offered = r["config"]["target_pps"]
    achieved = tx["achieved_pps"]
    row = {**extra, "frame_size_bytes": size, "offered_pps": round(offered, 1),
           "offered_mbps": round(mbps_for(offered, size), 3), "achieved_pps": round(achieved, 1),
           "achieved_mbps": round(mbps_for(achieved, size), 3), "frames_sent": tx.get("offered", tx["frames"]),
           "frames_received": rx.get("unique"), "lost": rx.get("lost"), "loss_ratio": rx.get("loss_ratio"),
           "lost_at_device_input": rx.get("lost_at_device_input"), "if_tx_dropped": tx.get("if_tx_dropped"),
           "duplicates": rx.get("duplicates"), "reordered": rx.get("reordered"), "seq_gaps": rx.get("seq_gaps"),
           "rx_pps": rx.get("rx_pps"), "rx_mbps": round(mbps_for(rx.get("rx_pps") or 0, size), 3),
           "latency_n": r.get("latency", {}).get("n"), **_lat(r),
           **_lat(r, "latency_socket", "latency_socket"),
           "generator_limited": bool(offered > 0 and achieved < GEN_LIMIT * offered),
           "tx_lateness_p99_ns": tx["lateness"].get("p99_ns"), "tx_gap_p50_ns": tx["gap"].get("p50_ns"),
           "tx_gap_p99_ns": tx["gap"].get("p99_ns"), "timestamp_source": r.get("timestamp_source")}
    return row


class SwitchBench:
    """Runs the modules against one device at a time and collects rows per module."""

    def __init__(self, plan: Plan, devices: list[str], modules: list[str], mtu: int = 1500,
                 step: Callable[[str], None] = lambda s: None, keep_frames: str | None = None,
                 names: Names = Names()):
        self.plan, self.devices, self.modules, self.mtu, self.step = plan, devices, modules, mtu, step
        self.names = names
        self.rows: dict[str, list[dict]] = {m: [] for m in MODULES + ("calibration-throughput", "throughput-repeats",
                                                                       "generator-ratio", "tx-stamp-check")}
        self.extra: dict = {"devices": {}, "offloads": {}, "flow_dumps": {}}
        self.gen_ceiling: dict[int, float] = {}
        self.keep_frames = keep_frames
        self.validate()

    # ----- checks before anything is built -----
    def validate(self) -> None:
        for d in self.devices:
            make_device(d, self.mtu, self.names)  # unknown device / bad MTU raise BenchError
        for m in self.modules:
            if m not in MODULES:
                raise BenchError(f"unknown module {m!r}: choose from {', '.join(MODULES)}")
        max_frame = self.mtu + 18
        for s in set(self.plan.sizes) | set(self.plan.tput_sizes) | set(self.plan.gen_sizes) | {self.plan.load_size}:
            if s < 64:
                raise BenchError(f"frame size {s} is below the Ethernet minimum of 64 bytes")
            if s > max_frame:
                raise BenchError(f"frame size {s} is above the MTU: --mtu {self.mtu} allows frames up to "
                                 f"{max_frame} bytes (use --mtu {s - 18} for jumbo frames)")
        if self.plan.tput_repeats < 1 or self.plan.search.final_trials < 1:
            raise BenchError("--tput-repeats and --final-trials must be >= 1")
        if self.plan.search.trial_s <= 0:
            raise BenchError("--trial-s must be > 0")

    def planned_steps(self) -> int:
        p, n = self.plan, 0
        per_dev = {"frame-size": len(p.sizes), "load": len(p.loads_mbps),
                   "throughput": len(p.tput_sizes) * p.tput_repeats, "action-delay": 4, "flow-install": 2,
                   "packet-in": 1, "echo": 1}
        if "calibration" in self.modules:
            n += 2 * len(p.sizes) + len(p.loads_mbps) + len(p.tput_sizes) + 1
        if "generator" in self.modules:
            n += len(p.gen_sizes) * p.gen_repeats * 2
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

    def _trial_fn(self, dev: Device, size: int, flows: int = 1):
        def trial(rate: float, seconds: float) -> tuple[float, float]:
            r = self._run(dev, size, rate, rate * seconds, stamp_every=0, linger_s=0.3, flows=flows)
            return r["tx"]["achieved_pps"], r["rx"]["loss_ratio"] or 0.0
        return trial

    def _search(self, dev: Device, module: str, size: int, ceiling: float | None,
                plan: rfc2544.SearchPlan | None = None, repeat: int = 0) -> dict:
        """RFC 2544 throughput (rfc2544.search), starting at the tool's ceiling."""
        plan = plan or self.plan.search
        res = rfc2544.search(self._trial_fn(dev, size), ceiling or 2e6, plan)
        row = {"module": module, "device": dev.name, "frame_size_bytes": size, "repeat": repeat, **res.row(),
               "throughput_mbps": round(mbps_for(res.throughput_pps, size), 3),
               "line_rate_10g_pps": round(10e9 / ((size + L1_OVERHEAD) * 8), 1),
               "tool_ceiling_pps": round(ceiling, 1) if ceiling else None, "trial_s": plan.trial_s,
               "final_trial_s": plan.final_s, "final_trials": plan.final_trials,
               "rfc_trial_length": plan.rfc_trial_length, "loss_tolerance": plan.loss_tolerance,
               "method": plan.describe()}
        self.rows[module].append(row)
        return row

    # ----- modules -----
    def calibration(self) -> None:
        """The floor of the measuring system, three ways, and the tool's ceiling.

        direct veth: the TX stamp (skb_tx_timestamp in g0's veth_xmit) and the RX stamp (taken in
          netif_rx when r0's backlog queue accepts the frame) come from one call chain on one CPU: the
          floor is the cost of handing a frame across a veth, nothing of a receive path.
        to the socket: the same frames, TX stamp -> the receiving thread's clock when recvmmsg returned
          them: r0's backlog, softirq, AF_PACKET delivery and the thread's wake-up (user-space clock).
        redirect: g0 -> dg0 [tc mirred] dr0 -> r0: dg0's whole receive path (backlog, softirq, up to tc
          ingress) and a second veth between the stamps; the floor for a device that receives frames."""
        p = self.plan
        ceiling_plan = dataclasses.replace(p.search, final_s=0)  # the top of the device searches
        dev = VethDevice(self.mtu, self.names)
        dev.setup()
        try:
            self.extra["devices"]["veth"] = dev.describe()
            self.extra["offloads"]["veth"] = dev.offloads()
            for s in p.sizes:
                self.step(f"calibration: veth {s} B at {p.fixed_load_mbps:g} Mb/s")
                self._fixed(dev, "calibration", s, p.fixed_load_mbps, p.point_s)
            for mbps in p.loads_mbps:  # paper Fig. 3: the loopback against load
                self.step(f"calibration: {p.load_size} B at {mbps:g} Mb/s")
                self._fixed(dev, "load", p.load_size, mbps, p.point_s)
            self.step("calibration: TX stamps against a capture")
            self.tx_stamp_check(dev)
            for s in p.tput_sizes:
                self.step(f"calibration: tool ceiling at {s} B")
                row = self._search(dev, "calibration-throughput", s, None, plan=ceiling_plan)
                self.gen_ceiling[s] = row["throughput_pps"] or None
        finally:
            dev.teardown()
        red = RedirectDevice(self.mtu, self.names)
        red.setup()
        try:
            self.extra["devices"]["redirect"] = red.describe()
            for s in p.sizes:
                self.step(f"calibration: redirect {s} B at {p.fixed_load_mbps:g} Mb/s")
                self._fixed(red, "calibration", s, p.fixed_load_mbps, p.point_s)
        finally:
            red.teardown()

    def tx_stamp_check(self, dev: Device, frames: int = 5000, pps: float = 10000) -> dict:
        """The engine's TX stamps against an independent clock read: with the qdisc path (no bypass) a
        capture on the sending veth gets each frame from dev_queue_xmit_nit, which stamps its copy with
        its own ktime_get_real() just before the driver's veth_xmit takes the engine's TX stamp. Per
        frame, engine TX stamp - capture stamp must be small and never negative."""
        with tempfile.TemporaryDirectory(prefix="fathom-txcheck-") as tmp:
            pcap, frames_csv = Path(tmp) / "g0.pcap", Path(tmp) / "frames.csv"
            with Capture(dev.tx.ns, dev.tx.ifname, pcap, "udp and src port 4242", direction="out", nano=True,
                         buffer_kib=16384):
                r = run_engine(engine_args(dev.tx, dev.rx, size=128, rate_pps=pps, count=frames,
                                           dst_mac=dev.rx.mac, csv=str(frames_csv), extra=["--no-bypass"]))
            tx = {int(row["seq"]): int(row["tx_kernel_ns"]) for row in csvmod.DictReader(open(frames_csv))}
            captured = read_pcap_ns(pcap)
        diffs, outside = [], 0
        for i, (ts, f) in enumerate(captured):
            seq = int.from_bytes(f[46:50], "big") if len(f) >= 50 else -1
            if tx.get(seq):
                diffs.append(tx[seq] - ts)
                # one sending thread, queue-less veth: the driver stamps a frame before the next one
                # reaches the tap, so a stamp past the next capture belongs to another frame or send
                if i + 1 < len(captured) and tx[seq] > captured[i + 1][0]:
                    outside += 1
        row = {"module": "tx-stamp-check", "device": dev.name, "frames_sent": r["tx"]["frames"],
               "captured": len(captured), "matched": len(diffs),
               "negative": sum(1 for d in diffs if d < 0), "past_next_capture": outside,
               "what": "engine TX stamp (veth_xmit) - capture stamp (dev_queue_xmit_nit), same frame, qdisc path",
               **summarize(diffs)}
        self.rows["tx-stamp-check"].append(row)
        return row

    def generator(self) -> None:
        p = self.plan
        dev = VethDevice(self.mtu, self.names)
        dev.setup()
        try:
            rows, ratios = generator.compare(dev.tx.ns, dev.tx.ifname, dev.rx.mac, dev.tx.mac, p.gen_sizes,
                                             p.gen_repeats, p.gen_window_s, step=self.step)
        finally:
            dev.teardown()
        self.rows["generator"] += [{"module": "generator", **r} for r in rows]
        self.rows["generator-ratio"] += [{"module": "generator-ratio", **r} for r in ratios]

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
        """RFC 2544 throughput per frame size; with --tput-repeats, the sizes are swept that many times in
        turn and each size's determinations summarised by median, min and max."""
        done: dict[int, list[float]] = {}
        for rep in range(self.plan.tput_repeats):
            for s in self.plan.tput_sizes:
                self.step(f"{dev.name}: RFC 2544 throughput at {s} B")
                row = self._search(dev, "throughput", s, self.gen_ceiling.get(s), repeat=rep)
                done.setdefault(s, []).append(row["throughput_pps"])
        self.rows["throughput-repeats"] += [{"module": "throughput-repeats", "device": dev.name,
                                             "frame_size_bytes": s, **rfc2544.summarize_repeats(v)}
                                            for s, v in done.items()]

    def flow_install(self, dev: OvsDevice) -> None:
        """Oflops add_flow, on one clock. First the device's zero-loss rate with all N flows installed
        (RFC 2544 search, probes round-robin over the N flows); then, with the table empty, probes at a
        share of that rate, N flow_mods and a barrier. The flow_mods and the barrier reply are stamped by
        a capture on the switch's loopback, the probes by the engine: kernel software stamps, one clock.
        Per flow: delay from its flow_mod to the first probe forwarded (RX stamp; an upper bound of the
        activation) and to the last probe not forwarded (TX stamp; a lower bound), and probes lost after
        the flow was active."""
        p = self.plan
        specs = [{"priority": 100, "match": {"in_port": GEN_PORT, "eth_type": 0x0800, "ip_proto": 17,
                                             "udp_dst": 9000 + i}, "actions": [["output", RCV_PORT]]}
                 for i in range(p.flows)]
        self.step(f"{dev.name}: flow install, zero-loss rate over {p.flows} flows")
        dev.of({"op": "clear"})
        dev.flows(specs, barrier=True)
        zl_plan = dataclasses.replace(p.search, final_s=min(p.search.final_s, 2.0 if p.quick else 10.0),
                                      max_trials=max(p.search.max_trials, 14))
        zl = rfc2544.search(lambda rate, s: self._trial_fn(dev, 64, p.flows)(rate, s),
                            self.gen_ceiling.get(64) or 2e6, zl_plan)
        # a rate the short trials passed but the longer one did not still bounds the probes from above
        zero_loss = zl.throughput_pps or zl.search_pps
        if zero_loss <= 0:
            tried = ", ".join(f"{t.offered_pps / 1000:.1f} kpps: loss {t.loss_ratio:.4f}" for t in zl.trials)
            raise BenchError(f"flow-install: {dev.name} lost frames at every rate tried ({tried}); there is no "
                             f"zero-loss rate to probe below")
        pps = p.flow_probe_share * zero_loss
        self.step(f"{dev.name}: flow install, {p.flows} flows, probes at {pps / 1000:.1f} kpps")
        dev.of({"op": "clear"})
        settle_s, tail_s = 0.8, 1.5
        count = int(pps * (settle_s + tail_s + 0.5))
        with tempfile.TemporaryDirectory(prefix="fathom-flowinstall-") as tmp:
            pcap, frames_csv = Path(tmp) / "lo.pcap", Path(tmp) / "frames.csv"
            with Capture(dev.names.dut, "lo", pcap, f"tcp port {OF_PORT}", nano=True, buffer_kib=16384):
                proc = start_engine(engine_args(dev.tx, dev.rx, size=64, rate_pps=pps, count=count,
                                                dst_mac=dev.rx.mac, flows=p.flows, stamp_every=1, warmup_s=0.05,
                                                csv=str(frames_csv), extra=["--spin-us", str(p.spin_us)]))
                try:
                    time.sleep(settle_s)
                    res = dev.flows(specs, barrier=True)
                finally:
                    r = finish_engine(proc)
                time.sleep(0.2)
            msgs = openflow_messages(read_pcap_ns(pcap), OF_PORT)
            frames = list(csvmod.DictReader(open(frames_csv)))
        rows, summary = flow_install_rows(dev.name, p.flows, res["xids"], res.get("barrier_xid"), msgs, frames)
        self.rows["flow-install"] += rows
        self.extra["flow_install"] = {**summary, "probe_pps": round(pps, 1), "zero_loss_pps": zero_loss,
                                      "zero_loss_confirmed": zl.confirmed,
                                      "probe_share_of_zero_loss": p.flow_probe_share,
                                      "zero_loss_search": zl.row(), "zero_loss_method": zl_plan.describe(),
                                      "probe_interval_per_flow_ns": round(p.flows / pps * 1e9),
                                      "engine_rx_unique": r["rx"]["unique"], "engine_frames": r["tx"]["frames"],
                                      "clock": "kernel software stamps (CLOCK_REALTIME): flow_mod and barrier "
                                               "reply captured on the switch's loopback, probes TX/RX stamped"}

    def packet_in(self, dev: OvsDevice) -> None:
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
            tx = {int(row["seq"]): int(row["tx_kernel_ns"]) for row in csvmod.DictReader(open(tmp.name))}
        lat, seen = [], set()
        for t, hexdata in events:
            data = bytes.fromhex(hexdata)
            if len(data) < 50 or data[42:46] != b"\xbe\x9b\xe9\x55":
                continue
            seq = int.from_bytes(data[46:50], "big")
            if seq in tx and tx[seq] and seq not in seen:
                seen.add(seq)
                lat.append(t - tx[seq])
        sent = r["tx"]["offered"]  # frames handed to the device (none given up)
        row = {"module": "packet-in", "device": dev.name, "frames_sent": sent,
               "packet_ins": len(events), "matched": len(lat),
               "loss_ratio": round(1 - len(lat) / max(1, sent), 6), "offered_pps": p.packet_in_pps,
               "clock": "kernel TX stamp -> time.time_ns() in the os-ken handler", **summarize(lat)}
        self.rows["packet-in"].append(row)
        self.extra["packet_in_latencies_ns"] = lat

    def echo(self, dev: OvsDevice) -> None:
        self.step(f"{dev.name}: echo round trip")
        rtts = dev.of({"op": "echo", "count": self.plan.echo_count})["rtt_ns"]
        self.rows["echo"].append({"module": "echo", "device": dev.name, "count": len(rtts),
                                  "clock": "time.time_ns() send -> reply handler", **summarize(rtts)})

    def run_device(self, name: str) -> None:
        dev = make_device(name, self.mtu, self.names)
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
                if m in ("calibration", "generator", "overlay"):
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
        if "generator" in self.modules:
            self.generator()
        for d in self.devices:
            if d in ("veth", "redirect") and "calibration" in self.modules:
                continue
            self.run_device(d)
        if "overlay" in self.modules:
            from .overlay import run_overlay
            self.rows["overlay"], self.extra["overlay"] = run_overlay(self.plan, self.step, self.names)
        return {m: rows for m, rows in self.rows.items() if rows}


def flow_install_rows(device: str, n_flows: int, xids: list[int], barrier_xid: int | None, msgs: list,
                      frames: list[dict]) -> tuple[list[dict], dict]:
    """Per-flow install delays from the captured OpenFlow messages and the engine's per-frame records
    (seq, tx_kernel_ns, rx_kernel_ns, arrivals); the probe of seq s belongs to flow s mod n_flows."""
    seen = {m.xid: m.seen_ns for m in msgs if m.to_switch and m.type == OFPT_FLOW_MOD}
    barrier = [m.seen_ns for m in msgs if not m.to_switch and m.type == OFPT_BARRIER_REPLY
               and (barrier_xid is None or m.xid == barrier_xid)]
    barrier_ns = barrier[-1] if barrier else None
    per_flow: list[list[dict]] = [[] for _ in range(n_flows)]
    for f in frames:
        per_flow[int(f["seq"]) % n_flows].append(f)
    rows, lost_after, lost_before = [], 0, 0
    for i in range(n_flows):
        t_mod = seen.get(xids[i]) if i < len(xids) else None
        probes = sorted(per_flow[i], key=lambda f: int(f["seq"]))
        first = next((f for f in probes if f["arrivals"] != "0"), None)
        row = {"module": "flow-install", "device": device, "flow": i, "udp_dst": 9000 + i,
               "flow_mod_seen_ns": t_mod, "first_rx_ns": int(first["rx_kernel_ns"]) if first else None,
               "first_forwarded_tx_ns": int(first["tx_kernel_ns"]) if first else None,
               "first_forwarded_left_before_flow_mod": None,
               "install_delay_ns": None, "active_after_ns": None, "barrier_reply_ns": barrier_ns,
               "active_before_barrier": None, "probes": len(probes), "probes_lost_before_active": None,
               "probes_lost_after_active": None}
        if first:
            k = probes.index(first)
            before, after = probes[:k], probes[k + 1:]
            row["probes_lost_before_active"] = len(before)
            row["probes_lost_after_active"] = sum(1 for f in after if f["arrivals"] == "0")
            lost_after += row["probes_lost_after_active"]
            lost_before += len(before)
            if t_mod:
                row["install_delay_ns"] = int(first["rx_kernel_ns"]) - t_mod
                # it waited at the switch's input while the rule was being installed
                row["first_forwarded_left_before_flow_mod"] = int(first["tx_kernel_ns"]) < t_mod
                # the last probe that was not forwarded although it left after the flow_mod was seen
                late = [int(f["tx_kernel_ns"]) for f in before if int(f["tx_kernel_ns"] or 0) > t_mod]
                row["active_after_ns"] = (max(late) - t_mod) if late else 0
            if barrier_ns:
                row["active_before_barrier"] = int(first["rx_kernel_ns"]) < barrier_ns
        rows.append(row)
    t0 = min(seen.values()) if seen else None
    summary = {"flows": n_flows, "flow_mods_captured": sum(1 for x in xids if x in seen),
               "barrier_reply_captured": barrier_ns is not None,
               "barrier_delay_ns": (barrier_ns - t0) if barrier_ns and t0 else None,
               "send_span_ns": (max(seen.values()) - t0) if seen else None,
               "flows_never_forwarded": sum(1 for r in rows if r["first_rx_ns"] is None),
               "first_forwarded_left_before_flow_mod": sum(1 for r in rows if r["first_forwarded_left_before_flow_mod"]),
               "probes_lost_after_active": lost_after, "probes_dropped_before_active": lost_before,
               "probes": len(frames)}
    return rows, summary


def summarize(values: list[int]) -> dict:
    """min/mean/std/percentiles (fathom.stats.percentile) of a list of ns values."""
    if not values:
        return {f"{k}": None for k in LAT_KEYS} | {"n": 0}
    v = sorted(values)
    n = len(v)
    mean = sum(v) / n
    std = (sum((x - mean) ** 2 for x in v) / (n - 1)) ** 0.5 if n > 1 else 0.0
    q = {f"p{name}_ns": round(percentile(v, p), 1) for name, p in (("50", 50), ("90", 90), ("99", 99), ("999", 99.9))}
    return {"n": n, "min_ns": v[0], "mean_ns": round(mean, 1), "std_ns": round(std, 1), **q, "max_ns": v[-1]}

"""`fathom bench sfc`: what steering through a port chain costs, against the same VNFs reached
without it; requests/s of a web chain; what PPTMon on a chain costs (paper Figs. 8-9).

One lab (fathom/lab/topologies/sfc.yaml, under its own controller), every VNF plugged hybrid (the
plugging PPTMon needs on the lab's userspace datapath, docs/sfc.md). Parts (`--part`):

- steering: for each path of VNFs, iperf3 TCP client -> server, `repeats` times interleaved,
  chained (a port chain whose classifier takes the client's TCP to the server's iperf3 port)
  against unchained (no chain, the same VNFs in the same order by plain routing: the client routes
  the server's address via the first VNF's ingress address, each VNF via the next one's; the last
  delivers), so the VNFs do the same work and the packets cross the same nodes; only the switches'
  steering differs. The figure is chained / unchained throughput, and per VNF hop (the ratio to the
  power 1/hops). Replies go straight back in both (the chain is not symmetric).
- web: ApacheBench through firewall -> DPI -> nginx (chained), against the same path unchained and
  against no VNF at all.
- pptmon: the chain's `pptmon` off and at one sample per second, in off/on pairs (`repeats`,
  default PPTMON_REPEATS): iperf3 through each VNF type alone (firewall, NAT, DPI, forwarder:
  Fig. 8), ab for `seconds` through the two real chains fw -> dpi and fw -> nat -> dpi to nginx
  (Fig. 9), and ab through HAProxy, which terminates TCP: there the figure is the chain's warning
  that the sampled packets never reach the sink. The client's MTU is lowered to CLIENT_MTU for the
  whole part, off and on alike, so that full-size segments have room for the option. The
  throughput figure is the median of the pairs' on/off ratios with a distribution-free interval,
  and whether that interval shows the 0.99 target, refutes it or cannot tell. Independent of
  throughput's spread, the kernel's BPF statistics (on for the part's duration: fathom.bench.bpfstats)
  give each program's run time per packet during every on run and its share of one core's time.
  Per on run also: the records the controller stored and the loaders' counters (sampled,
  reported, skip_mtu ...).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

from fathom.model.chains import OWNER_KIND, chain_label
from fathom.bench import bpfstats
from fathom.client import Client
from fathom.host.iperf import iperf3
from fathom.lab import vnf as vnfs
from fathom.lab.lab import Lab
from fathom.lab.sh import LabError, run
from fathom.lab.topology import DEFAULT_TOPOLOGY, load

TOPOLOGY = DEFAULT_TOPOLOGY.parent / "sfc.yaml"
PATHS = (("fw1",), ("fw1", "fw2"), ("fw1", "fw2", "fwd"))
WEB_PATH = ("fw1", "dpi")
PPTMON_VNFS = ("fw1", "nat", "dpi", "fwd")             # paper Fig. 8: firewall, NAT, DPI, forwarder
PPTMON_CHAINS = (("fw1", "dpi"), ("fw1", "nat", "dpi"))  # Fig. 9's two real chains, to nginx
PROXY = "proxy"                                         # HAProxy: ends TCP, and the option with it
PPTMON_REWRITERS = ("nat", PROXY)                       # VNFs whose traffic reaches the server from their own address
PPTMON_PERIOD_NS = 1_000_000_000      # one sample per second
PPTMON_TARGET = 0.99
PPTMON_REPEATS = 10                   # off/on pairs when not told: a 97.9 % interval for the median ratio
CI_LEVEL = 0.95
# The client's MTU in the PPTMon runs: a full-size segment leaves the 40 bytes of TCP option space
# free for the option (12 bytes + 4 per hop), as the paper plans the MTU for it. At 1500 the
# source finds no room in full-size segments (skip_mtu) and a bulk stream yields next to no sample.
CLIENT_MTU = 1460
WARNING_WAIT = 30.0                   # s of traffic through HAProxy until the chain warns
IPERF_PORT = 5201
TARGET_PER_HOP = 0.95
PARTS = ("steering", "web", "pptmon")


class SfcBench:
    def __init__(self, lab_name: str = "sfb", seconds: float = 5, repeats: int | None = None, requests: int = 2000,
                 concurrency: int = 4, parts: tuple[str, ...] = PARTS, progress=lambda msg, frac=None: None):
        """`repeats`: interleaved runs of each steering path and off/on pairs of each PPTMon path
        (default 3 and PPTMON_REPEATS)."""
        self.lab = Lab(lab_name)
        self.parts = tuple(p for p in PARTS if p in parts)
        self.seconds = seconds
        self.repeats, self.pptmon_repeats = repeats or 3, repeats or PPTMON_REPEATS
        self.requests, self.concurrency = requests, concurrency
        self.progress = progress

    # ------------------------------------------------------------------ lab facts
    def _topo(self):
        """sfc.yaml with every VNF plugged hybrid, the plugging PPTMon needs on the lab's userspace
        datapath (docs/sfc.md); the steering paths cross them the same way."""
        topo = load(TOPOLOGY)
        nodes = [n.model_copy(update={"vnfs": [v.model_copy(update={"plug": "hybrid"}) for v in n.vnfs]})
                 for n in topo.nodes]
        return topo.model_copy(update={"nodes": nodes})

    def _vnf(self, name):
        return next(v for _, v in self._topo().vnfs() if v.name == name)

    def _ip(self, vm: str) -> str:
        return str(next(v for _, v in self._topo().vms() if v.name == vm).ip.ip)

    # ------------------------------------------------------------------ paths
    @contextlib.contextmanager
    def chained(self, api: Client, path: tuple[str, ...], port: int):
        created = self.lab.state()["controller"]["created"]
        made = []
        try:
            gids = []
            for v in path:
                g = api.post("/sfc/port_pair_groups", json={"port_pairs": [created["port_pairs"][v]], "project_id": "demo"})
                made.append(f"/sfc/port_pair_groups/{g['id']}")
                gids.append(g["id"])
            fc = api.post("/sfc/flow_classifiers", json={
                "protocol": "tcp", "destination_port_range_min": port, "destination_port_range_max": port,
                "logical_source_port": created["ports"]["client"], "logical_destination_port": created["ports"]["server"],
                "project_id": "demo"})
            made.append(f"/sfc/flow_classifiers/{fc['id']}")
            ch = api.post("/sfc/port_chains", json={"port_pair_groups": gids, "flow_classifiers": [fc["id"]],
                                                      "project_id": "demo"})
            made.append(f"/sfc/port_chains/{ch['id']}")
            api.wait_status("sfc/port_chains", ch["id"], timeout=30)
            yield ch["id"]
        finally:
            for p in reversed(made):
                api.delete(p)
            api.sync()

    @contextlib.contextmanager
    def unchained(self, path: tuple[str, ...]):
        """The same VNFs in the same order by plain routing: host routes to the server's address."""
        server = self._ip("server")
        hops = [("client", None)] + [(v, vnfs.TABLE_FORWARD) for v in path]
        nexts = [str(self._vnf(v).ingress.ip.ip) for v in path] + [None]
        done = []
        try:
            for (ns, table), nxt in zip(hops, nexts):
                if nxt is None:
                    continue
                cmd = ["ip", "route", "replace", f"{server}/32", "via", nxt] + (["table", table] if table else [])
                run(cmd, ns=self.lab.ns(ns))
                done.append((ns, table))
            yield
        finally:
            for ns, table in done:
                run(["ip", "route", "del", f"{server}/32"] + (["table", table] if table else []),
                    ns=self.lab.ns(ns), check=False)

    def _iperf(self) -> float:
        r = iperf3(self.lab.ns("client"), self.lab.ns("server"), self._ip("server"), seconds=self.seconds, omit=1)
        return r.gbps

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        self.progress("building the lab")
        self.lab.down()
        try:
            self.lab.up(self._topo(), str(TOPOLOGY))
            return self._measure()
        finally:
            self.lab.down()

    def _measure(self) -> dict:
        api = Client.for_lab(self.lab.state())
        doc = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
               "lab": self.lab.name, "topology": str(TOPOLOGY.name), "seconds": self.seconds, "repeats": self.repeats,
               "pptmon_repeats": self.pptmon_repeats,
               "parts": list(self.parts), "target_per_hop": TARGET_PER_HOP, "paths": []}
        self._start_web()
        if "steering" in self.parts:
            doc["paths"] = [self._steering(api, path) for path in PATHS]
        if "web" in self.parts:
            doc["web"] = self._web(api)
        if "pptmon" in self.parts:
            doc["pptmon"] = self._pptmon(api)
        doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        api.close()
        return doc

    def _steering(self, api: Client, path: tuple[str, ...]) -> dict:
        """iperf3 through `path` chained and unchained, interleaved."""
        runs = {"chained": [], "unchained": []}
        for i in range(self.repeats):
            for mode in ("unchained", "chained"):
                self.progress(f"steering {' → '.join(path)}: {mode} run {i + 1}/{self.repeats}")
                ctx = self.chained(api, path, IPERF_PORT) if mode == "chained" else self.unchained(path)
                with ctx:
                    runs[mode].append(self._iperf())
        ch, un = statistics.median(runs["chained"]), statistics.median(runs["unchained"])
        ratio = ch / un if un else None
        nodes = sorted({n.name for n, v in self._topo().vnfs() if v.name in path})
        return {"vnfs": list(path), "hops": len(path), "nodes": nodes, "gbps": runs,
                "median_gbps": {"chained": ch, "unchained": un}, "ratio": ratio,
                "ratio_per_hop": ratio ** (1 / len(path)) if ratio else None}

    # ------------------------------------------------------------------ PPTMon
    def _pptmon(self, api: Client) -> dict:
        """PPTMon off and at one sample per second, interleaved: iperf3 through each VNF type alone
        (paper Fig. 8), ab through the two real chains (Fig. 9) and through HAProxy (which ends the
        option: the chain must say so). The client's MTU is CLIENT_MTU for all of it, off and on."""
        self._admit_from(api, [str(self._vnf(v).egress.ip.ip) for v in PPTMON_REWRITERS], (80, IPERF_PORT))
        out = {"period_ns": PPTMON_PERIOD_NS, "client_mtu": CLIENT_MTU, "target": PPTMON_TARGET,
               "ci_level": CI_LEVEL, "cores": os.cpu_count(), "plug": "hybrid", "vnfs": [], "chains": []}
        with self._client_mtu(CLIENT_MTU), bpfstats.enabled():
            for v in PPTMON_VNFS:
                out["vnfs"].append(self._onoff(api, (v,), IPERF_PORT, "gbps", self._iperf))
            for path in PPTMON_CHAINS:
                out["chains"].append(self._onoff(api, path, 80, "requests_per_s", self._ab_timed))
            out["proxy"] = self._onoff(api, (PROXY,), 80, "requests_per_s", self._ab_timed, warning=True)
        return out

    def _onoff(self, api: Client, path: tuple[str, ...], port: int, unit: str, measure, warning: bool = False) -> dict:
        """`measure()` through a chain of `path` (TCP to `port`) with pptmon off and on, in
        `pptmon_repeats` off/on pairs; the median pair ratio with its interval and verdict; per on
        run the records stored, the loaders' counters and the programs' run time."""
        runs, windows = {"off": [], "on": []}, []     # windows: from turning on to turned off again (ns)
        costs = []                                    # per on run: the programs' run time (BPF statistics)
        name = " → ".join(path)
        with self.chained(api, path, port) as chain_id:
            for i in range(self.pptmon_repeats):
                for mode in ("off", "on"):
                    self.progress(f"PPTMon {mode}: {name}: run {i + 1}/{self.pptmon_repeats}")
                    since = time.time_ns()
                    _set_pptmon(api, chain_id, mode == "on")
                    if mode == "off" and windows:
                        windows[-1] = (windows[-1][0], time.time_ns())
                    if mode == "on":
                        value, cost = self._costed(chain_id, path, measure)
                        costs.append(cost)
                        windows.append((since, None))
                    else:
                        value = measure()
                    runs[mode].append(value)
            said = self._proxy_warning(api, chain_id) if warning else None
            _set_pptmon(api, chain_id, False)      # the loaders end, writing their last counters
            windows[-1] = (windows[-1][0], time.time_ns())
            records = _settled_records(api, chain_id, windows)
            stats = api.get(f"/sfc/port_chains/{chain_id}/pptmon", params={"since": str(windows[0][0])})
            counters = self._loader_runs(chain_id)
        on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
        ratios = [b / a for a, b in zip(runs["off"], runs["on"]) if a]
        ci = median_ci(ratios, CI_LEVEL)
        out = {"vnfs": list(path), "nodes": [n.name for v in path for n, x in self._topo().vnfs() if x.name == v],
               "unit": unit, "runs": runs, "median": {"off": off, "on": on}, "ratio": on / off if off else None,
               "spread": max(_spread(runs["off"]), _spread(runs["on"])),
               "pair_ratios": ratios, "pair_ratio_median": statistics.median(ratios) if ratios else None,
               "pair_ratio_ci": ci, "verdict": verdict(ci, PPTMON_TARGET),
               "cost_per_run": costs, "cost": cost_summary(costs), "records_per_run": records,
               "counters_per_run": counters, "e2e": stats["e2e"],
               "per_vnf": {p["name"]: p["processing"] for g in stats["groups"] for p in g["port_pairs"]}}
        if warning:
            out["warning"] = said
        return out

    def _costed(self, chain_id: int, path: tuple[str, ...], measure) -> tuple[float, dict]:
        """`measure()` with the chain's PPTMon programs on, and what they ran during it: per
        program the packets, ns per packet and share of one core (kernel BPF statistics, read from
        the loaders before and after)."""
        loaders = self._loaders(chain_id)
        before = {pid: bpfstats.counts(pid) for pid in loaders}
        t0 = time.monotonic()
        value = measure()
        seconds = time.monotonic() - t0
        after = {pid: bpfstats.counts(pid) for pid in loaders}
        programs = []
        for pid, st in sorted(loaders.items(), key=lambda kv: kv[1]["vnf_id"]):
            ids = sorted(set(before[pid]) & set(after[pid]))
            for prog_id, prog in sorted(bpfstats.names(ids).items()):
                programs.append({"vnf": path[st["vnf_id"] - 1], "mode": st["mode"], "program": prog,
                                 "role": program_role(st["mode"], prog), "prog_id": prog_id,
                                 **bpfstats.cost(before[pid][prog_id], after[pid][prog_id], seconds)})
        if len(programs) != 2 * len(path):
            raise LabError(f"PPTMon on {' → '.join(path)}: found {len(programs)} programs of the chain's "
                           f"loaders, not {2 * len(path)}: {programs}")
        return value, {"seconds": seconds, "value": value, "programs": programs,
                       "core_share": sum(p["core_share"] for p in programs)}

    def _loaders(self, chain_id: int) -> dict[int, dict]:
        """pid -> the agent's record (mode, vnf_id, ...) of each loader of the chain on the lab's
        nodes (the agents' state files)."""
        out = {}
        for node in self.lab.nodes():
            for f in (Path(node.rundir) / "agent" / "pptmon").glob("*.json"):
                st = json.loads(f.read_text())
                if st.get("chain") == chain_label(chain_id) and Path(f"/proc/{st['pid']}").exists():
                    out[st["pid"]] = st
        return out

    def _proxy_warning(self, api: Client, chain_id: int) -> dict:
        """With pptmon on, ab through the chain until the controller warns that the sampled packets
        do not reach the sink (the agents report the loaders' counters every few seconds), at most
        WARNING_WAIT s."""
        self.progress("PPTMon on: waiting for the chain's warning")
        _set_pptmon(api, chain_id, True)
        deadline = time.monotonic() + WARNING_WAIT
        while True:
            vnfs.ab(self.lab.ns("client"), self._url(), 10_000_000, self.concurrency, seconds=2)
            st = api.get(f"/sfc/port_chains/{chain_id}/pptmon", params={"window": "1m"})
            if st["warnings"] or time.monotonic() > deadline:
                chain = api.get(f"/sfc/port_chains/{chain_id}")
                return {"warnings": st["warnings"], "status": chain["status"], "status_reason": chain["status_reason"],
                        "stamped": st["stamped"], "reached": st["reached"], "records": st["records"]}

    def _loader_runs(self, chain_id: int) -> list[dict]:
        """Per start of the chain's loaders (one per on run, in order): the counters each loader
        wrote last, summed over the chain — `sampled` by the sources, `reported` by the sinks, the
        skips of every hop. Read from the loaders' files on the lab's nodes."""
        starts: list[dict] = []
        for node in self.lab.nodes():
            for f in sorted((Path(node.rundir) / "pptmon" / chain_label(chain_id)).glob("vnf*.jsonl")):
                k, mode = -1, None
                for line in f.read_text().splitlines():
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if msg.get("type") == "attached":
                        k, mode = k + 1, msg.get("mode")
                        while len(starts) <= k:
                            starts.append({})
                        starts[k][f.name] = (mode, {})
                    elif msg.get("type") == "stats" and k >= 0:
                        starts[k][f.name] = (mode, msg.get("counters") or {})
        out = []
        for loaders in starts:
            total = {c: 0 for c in ("sampled", "reported", "skip_mtu", "skip_nospace", "skip_gso", "errors")}
            for mode, c in loaders.values():
                if mode in ("source", "source-sink"):
                    total["sampled"] += c.get("sampled", 0)
                if mode in ("sink", "source-sink"):
                    total["reported"] += c.get("reported", 0)
                for key in ("skip_mtu", "skip_nospace", "skip_gso", "errors"):
                    total[key] += c.get(key, 0)
            out.append(total)
        return out

    @contextlib.contextmanager
    def _client_mtu(self, mtu: int):
        """The client's interface MTU lowered to `mtu` (room for the option in full-size segments)."""
        ns = self.lab.ns("client")
        before = json.loads(run(["ip", "-j", "link", "show", "dev", "eth0"], ns=ns).stdout)[0]["mtu"]
        run(["ip", "link", "set", "dev", "eth0", "mtu", str(mtu)], ns=ns)
        try:
            yield
        finally:
            run(["ip", "link", "set", "dev", "eth0", "mtu", str(before)], ns=ns, check=False)

    def _admit_from(self, api: Client, ips: list[str], ports: tuple[int, ...]) -> None:
        """TCP to `ports` from these addresses into the demo project's default security group: what a
        NAT or a proxy VNF sends from its own address to the server."""
        default = next(g for g in api.get("/security-groups") if g["project_id"] == "demo" and g["name"] == "default")
        for ip in ips:
            for port in ports:
                api.post("/security-group-rules", json={
                    "security_group_id": default["id"], "direction": "ingress", "ethertype": "IPv4",
                    "protocol": "tcp", "port_range_min": port, "port_range_max": port,
                    "remote_ip_prefix": f"{ip}/32"})

    def _url(self) -> str:
        return f"http://{self._ip('server')}/index.html"

    def _ab_timed(self) -> float:
        result = vnfs.ab(self.lab.ns("client"), self._url(), 10_000_000, self.concurrency, seconds=self.seconds)
        if result["failed"]:
            raise LabError(f"ab saw failed requests: {result}")
        return result["requests_per_s"]

    def _start_web(self) -> None:
        """nginx on the server with a 1 KiB page (index.html)."""
        www = self.lab.dir / "www"
        www.mkdir(exist_ok=True)
        (www / "index.html").write_bytes(hashlib.shake_256(b"page").digest(1024))
        vnfs.start_web(self.lab.ns("server"), self.lab.dir / "server-web", www)

    def _web(self, api: Client) -> dict:
        url = self._url()
        out = {"path": list(WEB_PATH) + ["nginx"], "requests": self.requests, "concurrency": self.concurrency}
        self.progress("ab: no VNF")
        out["direct"] = vnfs.ab(self.lab.ns("client"), url, self.requests, self.concurrency)
        self.progress("ab: unchained")
        with self.unchained(WEB_PATH):
            out["unchained"] = vnfs.ab(self.lab.ns("client"), url, self.requests, self.concurrency)
        self.progress("ab: chained")
        with self.chained(api, WEB_PATH, 80):
            out["chained"] = vnfs.ab(self.lab.ns("client"), url, self.requests, self.concurrency)
        if out["chained"]["failed"] or out["unchained"]["failed"]:
            raise LabError(f"ab saw failed requests: {out}")
        return out


def _set_pptmon(api: Client, chain_id: int, on: bool) -> None:
    """Turn the chain's PPTMon on (one sample per PPTMON_PERIOD_NS) or off and wait until it holds:
    on, the chain is `active` once every instance's agent attached its programs; off, until the
    agents hold no chain attachment any more (the chain itself is `active` at once)."""
    api.patch(f"/sfc/port_chains/{chain_id}", json={"pptmon": {"period_ns": PPTMON_PERIOD_NS} if on else None})
    deadline = time.monotonic() + 60
    while True:   # a passing error (a switch reconnecting) is waited out, as in the lab tests
        st = api.wait_status("sfc/port_chains", chain_id, timeout=max(1.0, deadline - time.monotonic()))
        if st["status"] == "active" or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if st["status"] != "active":
        raise LabError(f"chain with pptmon {'on' if on else 'off'}: {st['status']}: {st['status_reason']}")
    deadline = time.monotonic() + 30
    while not on and any(k.startswith(f"{OWNER_KIND}:") for a in api.get("/agents") for k in a["objects"]):
        if time.monotonic() > deadline:
            raise LabError("the agents still hold the chain's PPTMon attachments 30 s after it was turned off")
        time.sleep(0.2)


def _settled_records(api: Client, chain_id: int, windows: list[tuple[int, int]]) -> list[int]:
    """Records stored for each window (ns), once the agents delivered them (they batch for a
    second): the same total twice, two seconds apart."""
    def count(since: int, until: int | None = None) -> int:
        params = {"since": str(since)} | ({"until": str(until)} if until else {})
        return api.get(f"/sfc/port_chains/{chain_id}/pptmon", params=params)["records"]
    total, deadline = count(windows[0][0]), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(2)
        again = count(windows[0][0])
        if again == total:
            break
        total = again
    return [count(a, b) for a, b in windows]


def program_role(mode: str, program: str) -> str:
    """What a loader's program does in its mode: ppt_in stamps a new sample at a source and the
    entry time at a transit or sink VNF; ppt_out stamps the exit time, and at a sink also reports
    and strips the option."""
    if program == "ppt_in":
        return "source" if mode in ("source", "source-sink") else "stamp in"
    return "stamp out + sink" if mode in ("sink", "source-sink") else "stamp out"


def median_ci(values: list[float], level: float) -> tuple[float, float, float] | None:
    """A distribution-free confidence interval for the median of `values` (independent draws):
    the order statistics the sign test gives, (x_(k), x_(n+1-k), coverage) with the largest k whose
    coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least `level`. None when even (min, max) covers
    less (fewer than 6 values for 0.95). Pure."""
    xs, n = sorted(values), len(values)
    best = None
    for k in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n
        if coverage < level:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


def verdict(ci: tuple[float, float, float] | None, target: float) -> str:
    """`shown` when the whole interval is at or above the target, `refuted` when it lies below it,
    else `not resolved`. Pure."""
    if ci is None:
        return "not resolved (too few pairs)"
    lo, hi, _ = ci
    return "shown" if lo >= target else "refuted" if hi < target else "not resolved"


def cost_summary(costs: list[dict]) -> dict:
    """The on runs' program costs summed up per program (VNF, program): the median ns per packet
    and packets/s over the runs, all packets, and the median share of one core of all the chain's
    programs together. Pure."""
    per: dict[tuple[str, str], list[dict]] = {}
    for run_ in costs:
        for p in run_["programs"]:
            per.setdefault((p["vnf"], p["program"]), []).append(p)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None
    programs = [{"vnf": v, "program": prog, "role": ps[0]["role"], "mode": ps[0]["mode"],
                 "ns_per_packet": med([p["ns_per_packet"] for p in ps]),
                 "packets_per_s": med([p["packets_per_s"] for p in ps]),
                 "packets": sum(p["packets"] for p in ps),
                 "core_share": med([p["core_share"] for p in ps])} for (v, prog), ps in per.items()]
    return {"programs": programs, "core_share": med([c["core_share"] for c in costs])}


def _spread(values: list[float]) -> float:
    """The largest distance of a run from the median, relative to the median."""
    m = statistics.median(values)
    return max(abs(v - m) for v in values) / m if m else 0.0


def markdown(doc: dict) -> str:
    lines = [f"# fathom bench sfc ({doc['started']}, {doc['seconds']} s runs)", ""]
    if doc.get("paths"):
        lines += [f"Steering: medians of {doc['repeats']} interleaved runs.", "","| VNFs | nodes | chained Gbit/s | unchained Gbit/s | chained / unchained | per VNF hop | target |",
                  "|---|---|---|---|---|---|---|"]
        for p in doc["paths"]:
            ok = p["ratio_per_hop"] is not None and p["ratio_per_hop"] >= doc["target_per_hop"]
            lines.append(f"| {' → '.join(p['vnfs'])} | {', '.join(p['nodes'])} | {p['median_gbps']['chained']:.2f} | "
                         f"{p['median_gbps']['unchained']:.2f} | {p['ratio']:.3f} | {p['ratio_per_hop']:.3f} | "
                         f"{'met' if ok else 'missed'} (≥ {doc['target_per_hop']}) |")
    w = doc.get("web")
    if w:
        lines += ["", f"ab -n {w['requests']} -c {w['concurrency']} through {' → '.join(w['path'])}:", "",
                  "| path | requests/s | mean ms per request |", "|---|---|---|"]
        for k in ("direct", "unchained", "chained"):
            lines.append(f"| {k} | {w[k]['requests_per_s']:.0f} | {w[k]['time_per_request_ms']:.2f} |")
    pm = doc.get("pptmon")
    if pm:
        rate = f"1 sample / {pm['period_ns'] / 1e9:g} s"
        rows = pm["vnfs"] + pm["chains"] + [pm["proxy"]]
        lines += ["", f"PPTMon off and at {rate}, in off/on pairs (VNFs plugged {pm['plug']}, client MTU "
                  f"{pm['client_mtu']}); iperf3 {doc['seconds']} s per VNF type, ab -t {doc['seconds']} -c 4 "
                  "through the real chains to nginx. Pair ratio: on / off of one pair; interval: distribution-free "
                  f"(sign test) for the median pair ratio, at least {pm['ci_level']:.0%}. Spread: the largest "
                  "distance of a run from its median.", "",
                  "| through | off | on | pairs | median pair ratio | interval (coverage) | spread | "
                  f"on ≥ {pm['target']} of off | records per on run | sampled / reported / skip_mtu per on run |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [_pptmon_row(r) for r in rows]
        lines += ["", "PPTMon's own run time, from the kernel's BPF statistics of each program during the on runs "
                  "(medians over the runs). Share of one core: the program's run time per second of the run "
                  "(ns per packet × packets/s ÷ 1e9), against one core's whole time, which also runs the VNF, "
                  f"the switch and the traffic ({pm['cores']} cores here). It counts the programs' run time "
                  "(with part of the statistics' own clock reads: an upper bound), not cache effects, the TC "
                  "hook itself or the option's bytes on the wire.", "",
                  "| through | VNF | program | role | ns / packet | packets/s | packets | share of one core |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            for p in sorted(r["cost"]["programs"], key=lambda p: (r["vnfs"].index(p["vnf"]), p["program"])):
                lines.append(f"| {' → '.join(r['vnfs'])} | {p['vnf']} | {p['program']} | {p['role']} | "
                             f"{_num(p['ns_per_packet'], '.0f')} | {_num(p['packets_per_s'], ',.0f')} | "
                             f"{p['packets']:,} | {_num(p['core_share'], '.3%')} |")
            share = r["cost"]["core_share"]
            within = "" if share is None else \
                f" ({'within' if share <= 1 - pm['target'] else 'beyond'} the {1 - pm['target']:.0%} the target allows)"
            lines.append(f"| {' → '.join(r['vnfs'])} | all | | | | | | **{_num(share, '.3%')}**{within} |")
        warn = pm["proxy"].get("warning") or {}
        lines += ["", f"HAProxy: stamped {warn.get('stamped')}, reached the sink {warn.get('reached')}; "
                  f"the chain says: {'; '.join(warn.get('warnings') or []) or '(no warning)'}"]
    return "\n".join(lines) + "\n"


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pptmon_row(r: dict) -> str:
    unit = "Gbit/s" if r["unit"] == "gbps" else "req/s"
    fmt = (lambda v: f"{v:.2f}") if r["unit"] == "gbps" else (lambda v: f"{v:,.0f}")
    ci = r["pair_ratio_ci"]
    interval = "-" if ci is None else f"{ci[0]:.3f} – {ci[1]:.3f} ({ci[2]:.1%})"
    counters = ", ".join(f"{c['sampled']}/{c['reported']}/{c['skip_mtu']}" for c in r["counters_per_run"])
    return (f"| {' → '.join(r['vnfs'])} ({unit}) | {fmt(r['median']['off'])} | {fmt(r['median']['on'])} | "
            f"{len(r['pair_ratios'])} | {_num(r['pair_ratio_median'], '.3f')} | {interval} | ±{r['spread']:.1%} | "
            f"**{r['verdict']}** | {', '.join(str(n) for n in r['records_per_run'])} | {counters} |")

"""`fathom bench sfc`: what steering through a port chain costs, against the same VNFs reached
without it, and requests/s of a web chain.

One lab (fathom/lab/topologies/sfc.yaml, under its own controller). For each path of VNFs:

- chained: a port chain whose classifier takes the client's TCP to the server's iperf3 port;
- unchained: no chain, the same VNFs in the same order by plain routing (the client routes the
  server's address via the first VNF's ingress address, each VNF via the next one's; the last
  delivers), so the VNFs do the same work and the packets cross the same nodes; only the switches'
  steering differs.

Both are iperf3 TCP client -> server, interleaved, `repeats` times. The figure is chained / unchained
throughput, and per VNF hop (the ratio to the power 1/hops). Replies go straight back in both (the
chain is not symmetric). Then ApacheBench through firewall -> DPI -> nginx (chained), against the
same path unchained and against no VNF at all.

Last, what PPTMon on a chain costs: the chain fw1 → dpi (both VNFs plugged hybrid in this bench's
lab, the plugging PPTMon needs on the userspace datapath, docs/sfc.md) with `pptmon` off and at one
sample per second, interleaved, iperf3 each; the figure is on / off.
"""
from __future__ import annotations

import contextlib
import hashlib
import platform
import statistics
import time

from fathom.client import Client
from fathom.host.iperf import iperf3
from fathom.lab import vnf as vnfs
from fathom.lab.lab import Lab
from fathom.lab.sh import LabError, run
from fathom.lab.topology import DEFAULT_TOPOLOGY, load

TOPOLOGY = DEFAULT_TOPOLOGY.parent / "sfc.yaml"
PATHS = (("fw1",), ("fw1", "fw2"), ("fw1", "fw2", "fwd"))
WEB_PATH = ("fw1", "dpi")
PPTMON_PATH = ("fw1", "dpi")
PPTMON_PERIOD_NS = 1_000_000_000      # one sample per second
IPERF_PORT = 5201
TARGET_PER_HOP = 0.95


class SfcBench:
    def __init__(self, lab_name: str = "sfb", seconds: float = 5, repeats: int = 3, requests: int = 2000,
                 concurrency: int = 4, progress=lambda msg, frac=None: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats = seconds, repeats
        self.requests, self.concurrency = requests, concurrency
        self.progress = progress

    # ------------------------------------------------------------------ lab facts
    def _topo(self):
        """sfc.yaml with the PPTMon chain's VNFs plugged hybrid (they carry every path's traffic too)."""
        topo = load(TOPOLOGY)
        nodes = [n.model_copy(update={"vnfs": [v.model_copy(update={"plug": "hybrid"}) if v.name in PPTMON_PATH
                                               else v for v in n.vnfs]}) for n in topo.nodes]
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
               "target_per_hop": TARGET_PER_HOP, "paths": []}
        steps = len(PATHS) * self.repeats * 2 + 3
        done = 0
        for path in PATHS:
            runs = {"chained": [], "unchained": []}
            for i in range(self.repeats):
                for mode in ("unchained", "chained"):
                    self.progress(f"{' → '.join(path)}: {mode} run {i + 1}/{self.repeats}", done / steps)
                    ctx = self.chained(api, path, IPERF_PORT) if mode == "chained" else self.unchained(path)
                    with ctx:
                        runs[mode].append(self._iperf())
                    done += 1
            ch, un = statistics.median(runs["chained"]), statistics.median(runs["unchained"])
            ratio = ch / un if un else None
            nodes = sorted({n.name for n, v in self._topo().vnfs() if v.name in path})
            doc["paths"].append({"vnfs": list(path), "hops": len(path), "nodes": nodes, "gbps": runs,
                                 "median_gbps": {"chained": ch, "unchained": un}, "ratio": ratio,
                                 "ratio_per_hop": ratio ** (1 / len(path)) if ratio else None})
        doc["web"] = self._web(api, lambda frac: None)
        doc["pptmon"] = self._pptmon(api)
        doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        api.close()
        return doc

    def _pptmon(self, api: Client) -> dict:
        """iperf3 through fw1 → dpi with the chain's pptmon off and on (1 sample/s), interleaved."""
        runs = {"off": [], "on": []}
        with self.chained(api, PPTMON_PATH, IPERF_PORT) as chain_id:
            for i in range(self.repeats):
                for mode in ("off", "on"):
                    self.progress(f"PPTMon {mode}: run {i + 1}/{self.repeats}")
                    _set_pptmon(api, chain_id, mode == "on")
                    runs[mode].append(self._iperf())
            stats = api.get(f"/sfc/port_chains/{chain_id}/pptmon", params={"window": "10m"})
        on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
        return {"vnfs": list(PPTMON_PATH), "plug": "hybrid", "period_ns": PPTMON_PERIOD_NS, "gbps": runs,
                "median_gbps": {"off": off, "on": on}, "ratio": on / off if off else None,
                "records": stats["records"], "e2e": stats["e2e"], "web": self._pptmon_web(api)}

    def _pptmon_web(self, api: Client) -> dict:
        """ab (the web server started by _web) through fw1 → dpi with pptmon off and on, interleaved:
        requests are short segments, every one with room for the option."""
        url = f"http://{self._ip('server')}/index.html"
        runs = {"off": [], "on": []}
        with self.chained(api, WEB_PATH, 80) as chain_id:
            for i in range(self.repeats):
                for mode in ("off", "on"):
                    self.progress(f"PPTMon {mode}, ab: run {i + 1}/{self.repeats}")
                    _set_pptmon(api, chain_id, mode == "on")
                    result = vnfs.ab(self.lab.ns("client"), url, self.requests, self.concurrency)
                    if result["failed"]:
                        raise LabError(f"ab saw failed requests with pptmon {mode}: {result}")
                    runs[mode].append(result["requests_per_s"])
            stats = api.get(f"/sfc/port_chains/{chain_id}/pptmon", params={"window": "10m"})
        on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
        return {"vnfs": list(WEB_PATH), "requests_per_s": runs, "median_requests_per_s": {"off": off, "on": on},
                "ratio": on / off if off else None, "records": stats["records"], "e2e": stats["e2e"]}

    def _web(self, api: Client, _progress) -> dict:
        www = self.lab.dir / "www"
        www.mkdir(exist_ok=True)
        (www / "index.html").write_bytes(hashlib.shake_256(b"page").digest(1024))
        vnfs.start_web(self.lab.ns("server"), self.lab.dir / "server-web", www)
        url = f"http://{self._ip('server')}/index.html"
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
    """Turn the chain's PPTMon on (one sample per PPTMON_PERIOD_NS) or off and wait until it holds."""
    api.patch(f"/sfc/port_chains/{chain_id}", json={"pptmon": {"period_ns": PPTMON_PERIOD_NS} if on else None})
    st = api.wait_status("sfc/port_chains", chain_id, timeout=30)
    if st["status"] != "active":
        raise LabError(f"chain with pptmon {'on' if on else 'off'}: {st['status']}: {st['status_reason']}")


def markdown(doc: dict) -> str:
    lines = [f"# fathom bench sfc ({doc['started']}, {doc['seconds']} s iperf3 runs, median of {doc['repeats']})", "",
             "| VNFs | nodes | chained Gbit/s | unchained Gbit/s | chained / unchained | per VNF hop | target |",
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
        ratio = f"{pm['ratio']:.3f}" if pm["ratio"] is not None else "-"
        lines += ["", f"PPTMon on the chain {' → '.join(pm['vnfs'])} (VNFs plugged {pm['plug']}), iperf3, "
                  "off and on interleaved:", "",
                  "| pptmon | Gbit/s | on / off |", "|---|---|---|",
                  f"| off | {pm['median_gbps']['off']:.2f} | |",
                  f"| 1 sample / {pm['period_ns'] / 1e9:g} s | {pm['median_gbps']['on']:.2f} | {ratio} |",
                  "", f"(records stored meanwhile: {pm['records']})"]
        pw = pm.get("web")
        if pw:
            wr = f"{pw['ratio']:.3f}" if pw["ratio"] is not None else "-"
            lines += ["", f"ab -n {doc['web']['requests']} through {' → '.join(pw['vnfs'])} → nginx, pptmon off and on "
                      "interleaved:", "", "| pptmon | requests/s | on / off |", "|---|---|---|",
                      f"| off | {pw['median_requests_per_s']['off']:.0f} | |",
                      f"| 1 sample / {pm['period_ns'] / 1e9:g} s | {pw['median_requests_per_s']['on']:.0f} | {wr} |",
                      "", f"(records stored meanwhile: {pw['records']}; end to end p50 "
                      f"{(pw['e2e'] or {}).get('p50_us', '-')} µs)"]
    return "\n".join(lines) + "\n"

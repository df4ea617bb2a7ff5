"""A live trace: the probe (fathom.trace.probe) injected at the source port, seen in the kernel
at every observation point on its path, and the verdict of what it really did.

The controller never runs anything on a host: each node's agent arms its observation points
(`livetrace-watch`: eBPF at TC ingress and egress of the switch interfaces the packet crosses on
that node, native/pptmon/livetrace.c), the source node's agent, armed last, injects the probe, and every agent
answers what its points saw with kernel timestamps (bpf_ktime_get_ns, as PPTMon stamps), through
the same request desk as --actual (fathom.api.agent_traces). Nothing is added to any switch's
tables: the probe goes through the pipelines as the VM's own packets do; the stages it met are
read from each switch's own tables by ofproto/trace (the --actual walk), and the sightings say
where it really went and when.

Which interfaces are watched: on every node of the simulated walk, each switch interface the walk
enters or leaves by (the kernel interfaces among them: VM and VNF ports, router legs, the
underlay port `ul0`, which carries the tunnel's and the VLANs' frames), and the destination port.
"""
from __future__ import annotations

import secrets
import time
from typing import Callable

from fathom.model import TUNNEL_INTERFACE, UPLINK_INTERFACE, Port
from fathom.pipeline.catalogue import BR_INT, BR_PHY
from fathom.trace.probe import MIN_SIZE_TCP, Probe

PHY_UPLINK = "ul0"             # br-phy's underlay interface (fathom.controller.setups)
SETTLE = 0.15                  # seconds the probe (and the VM's reply) have to cross the cloud
MAX_DEVS = 32
SWITCHES = (BR_INT.bridge, BR_PHY.bridge)
TCP_RST, TCP_ACK = 0x04, 0x10
ANSWERS = ("echo reply", "SYN-ACK", "RST")     # what answers the probe (`packet` of a sighting)


# ask({node: request}) -> {node: the agent's `live` answer, or why it gave none (a str)}: the requests
# are put to all the nodes at once and answered within the trace's deadline
Ask = Callable[[dict[str, dict]], dict[str, "dict | str"]]


def watch_points(walk: dict, source: Port, target: Port | None) -> dict[str, list[str]]:
    """The interfaces to watch per node: where the simulated walk enters and leaves each node's
    switches (the underlay port for the tunnel and the uplink: their frames cross it), and both
    ends' ports (no target: the probe leaves the cloud where the walk does)."""
    out: dict[str, list[str]] = {}

    def add(node: str | None, dev: str | None) -> None:
        if node and dev and dev not in out.setdefault(node, []) and len(out[node]) < MAX_DEVS:
            out[node].append(dev)
    add(source.node, source.interface)
    for hop in walk["hops"]:
        if hop["bridge"] not in SWITCHES:
            continue
        for dev in [hop["in_port"], *(o["port"] for o in hop["outputs"])]:
            add(hop["name"], _dev(dev))
    if target is not None:
        add(target.node, target.interface)
        add(target.node, PHY_UPLINK)
    return out


def _dev(port: str) -> str:
    """The kernel interface a switch port's frames cross (the tunnel's and the uplink's: the underlay port)."""
    return PHY_UPLINK if port in (TUNNEL_INTERFACE, UPLINK_INTERFACE) else port


def exits(walk: dict) -> list[tuple[str, str]]:
    """Where the walk leaves the cloud (its `uplink` leaves): (node, the interface it leaves by)."""
    out = []
    for leaf in walk["leaves"]:
        hop = walk["hops"][leaf["hop"]] if leaf["result"] == "uplink" and leaf["hop"] is not None else None
        if hop is not None and hop["outputs"]:
            out.append((hop["name"], _dev(hop["outputs"][-1]["port"])))
    return out


def packet(seen: dict) -> str:
    """What a sighting saw, by name: an ICMP probe's "echo request" or "echo reply" (its ICMP type);
    a TCP probe's "SYN", or the "SYN-ACK" or "RST" (RST-ACK) answering it (its TCP flags)."""
    flags = seen.get("tcp_flags")
    if flags is None:
        return "echo request" if seen["icmp_type"] == 8 else "echo reply"
    return "RST" if flags & TCP_RST else "SYN-ACK" if flags & TCP_ACK else "SYN"


def _answer(p: dict) -> bool:
    return p["packet"] in ANSWERS


def _between(walk: dict) -> dict[tuple[str, str], dict]:
    """The walk's hops outside the switches (a VNF, a router's namespace, the upstream router), by
    where the packet comes back into a switch from them: (node, interface) -> the hop."""
    hops = walk["hops"]
    return {(child["name"], _dev(child["in_port"])): hops[child["from"]] for child in hops
            if child["from"] is not None and child["bridge"] in SWITCHES
            and hops[child["from"]]["bridge"] not in SWITCHES}


def run(walk: dict, source: Port, target: Port | None, ttl: int, size: int, ask: Ask, timeout: float = 5.0,
        tcp: tuple[int, int] | None = None) -> dict:
    """Inject the probe the simulated `walk` describes (an ICMP echo; with `tcp`, source and
    destination port, a TCP SYN of MIN_SIZE_TCP bytes, and after it the RST that ends it) and gather
    its sightings: the `live` part of a trace's result (fathom.trace.live.verdict reads it). The
    observation points end by themselves `timeout` seconds after they were attached, collected or not."""
    started = time.monotonic()
    probe, trace = Probe.new(), secrets.token_hex(8)
    pkt = walk["packet"]
    headers = (pkt["eth_src"], pkt["eth_dst"], pkt["ipv4_src"], pkt["ipv4_dst"], ttl)
    size = MIN_SIZE_TCP if tcp else size
    frame = probe.frame(*headers, size, tcp=tcp)
    points = watch_points(walk, source, target)
    what = (f"TCP SYN to port {tcp[1]} (the destination answers it like any SYN; the answer stops at the source "
            "port, and a RST after it closes what it opened)" if tcp else
            "ICMP echo request (the destination VM answers it; the reply stops at the source port)")
    live: dict = {"probe": {"what": what, "size": size, **probe.to_json(), **({"tcp_seq": probe.tcp_seq} if tcp else {})},
                  "source": {"node": source.node, "dev": source.interface},
                  "watched": {}, "not_watched": {}, "watchers": {}, "unknown": {}, "points": []}
    arm = {node: {"kind": "live-arm", "trace": trace, "probe": probe.to_json(), "devs": devs, "timeout_ms": int(timeout * 1000),
                  **({"drop_reply": source.interface} if node == source.node else {}), **({"tcp": True} if tcp else {})}
           for node, devs in points.items()}
    armed, took = [], {}

    def armed_at(answers: dict) -> None:
        for node, got in answers.items():
            if isinstance(got, str):
                live["unknown"][node] = got
                continue
            live["watched"][node] = got.get("watched", [])
            if live["watched"][node]:
                armed.append(node)
            if got.get("not_watched"):
                live["not_watched"][node] = got["not_watched"]
            if got.get("watcher"):
                live["watchers"][node] = got["watcher"]
    # every other node first; then the source node, which injects the probe as soon as it is armed
    armed_at(ask({node: a for node, a in arm.items() if node != source.node}) if len(arm) > 1 else {})
    took["arm"] = time.monotonic()
    # the RST that closes what the SYN opened, sent before the source node disarms
    reset = {"reset": {"dev": source.interface, "frame": probe.frame(*headers, MIN_SIZE_TCP, tcp=tcp, reset=True).hex()}} \
        if tcp else {}
    # the source node injects, waits SETTLE and answers with its own sightings: it is not asked again
    got = ask({source.node: {**arm[source.node], "inject": {"dev": source.interface, "frame": frame.hex()},
                             "collect_after_ms": int(SETTLE * 1000), **reset}})
    armed_at(got)
    got = got[source.node]
    why = got if isinstance(got, str) else None if got.get("injected") else got.get("not_injected") or \
        f"the source port's interface {source.interface} cannot be watched on {source.node}"
    live["injected"] = why is None
    took["inject"] = time.monotonic()
    collected = {source.node: got} if isinstance(got, dict) and "seen" in got else {}
    collect = {node: {"kind": "live-collect", "trace": trace} for node in armed if node not in collected}
    if why is not None:
        live["not_injected"] = why
    for node, got in {**collected, **(ask(collect) if collect else {})}.items():
        if isinstance(got, str):
            live["unknown"][node] = got
            continue
        offset = got.get("realtime_offset_ns", 0)
        for s in got.get("seen", ()):
            live["points"].append({"node": node, **s, "packet": packet(s), "t_ns": s["ktime_ns"] + offset})
    took["collect"] = time.monotonic()
    live["points"].sort(key=lambda p: p["t_ns"])
    live["segments"] = _segments(live["points"], _between(walk))
    settle = SETTLE if collected else 0
    live["timings_ms"] = {"arm": took["arm"] - started, "inject": took["inject"] - took["arm"] - settle,
                          "settle": settle, "collect": took["collect"] - took["inject"]}
    live["timings_ms"] = {k: round(v * 1000, 1) for k, v in live["timings_ms"].items()}
    return live


def _segments(points: list[dict], between: dict[tuple[str, str], dict]) -> list[dict]:
    """The time between consecutive sightings: inside a node's switches (ingress → egress on one
    node), in a hop outside the switches (`between`: a VNF, a router's namespace, the upstream
    router; out of the switches → back in by the interface it returns by), in the underlay between
    nodes (egress → ingress), in the destination VM (the request out of the switch → its reply back
    in)."""
    start = points[0]["t_ns"] if points else 0
    for p in points:
        p["at_us"] = round((p["t_ns"] - start) / 1000, 3)
    out = []
    for a, b in zip(points, points[1:]):
        if a["dir"] == "injected":
            continue
        seg = {"from": _point(a), "to": _point(b), "us": round((b["t_ns"] - a["t_ns"]) / 1000, 3),
               "packet": b["packet"]}
        outside = between.get((b["node"], b["dev"])) if a["node"] == b["node"] else None
        if a["node"] == b["node"] and a["dir"] == "ingress" and b["dir"] == "egress":
            seg.update(where=f"switches of {a['node']}", node=a["node"], dev=a["dev"])
        elif a["dir"] == "egress" and b["dir"] == "ingress" and not _answer(a) and _answer(b) \
                and (a["node"], a["dev"]) == (b["node"], b["dev"]):
            seg["where"] = f"VM behind {a['dev']} on {a['node']} (answering)"
        elif a["dir"] == "egress" and b["dir"] == "ingress" and a["packet"] == b["packet"] and outside:
            where = outside["switch"] if outside["switch"].endswith(f" on {a['node']}") else \
                f"{outside['switch']} on {a['node']}"
            seg.update(where=where, node=b["node"], dev=b["dev"])
        elif a["dir"] == "egress" and b["dir"] == "ingress":
            seg["where"] = f"underlay {a['node']} → {b['node']}"
        else:
            seg["where"] = f"{_point(a)} → {_point(b)}"
        out.append(seg)
    return out


def _point(p: dict) -> str:
    return f"{p['dev']} {p['dir']} on {p['node']}"


def verdict(live: dict, target: Port | None, target_name: str | None, stages: dict,
            leaving: list[tuple[str, str]] = ()) -> dict:
    """What the probe did: delivered to the destination port (its switch sent it out of the port's
    interface); without a destination port, sent out of the cloud (out of an interface in
    `leaving`: fathom.trace.live.exits); dropped after the last point that saw it (with the stage
    the node's own tables drop it at, from `stages`: node -> the --actual walk's reason), or unknown."""
    if not live.get("injected"):
        return {"result": "unknown", "reason": f"no probe was injected: {live.get('not_injected')}"}
    requests = [p for p in live["points"] if not _answer(p) and p["dir"] != "injected"]
    answer = next((p for p in live["points"] if _answer(p)), None)
    how = {"SYN-ACK": " with SYN-ACK (a socket listens)", "RST": " with RST (no socket listens)"}.get(
        answer["packet"], "") if answer else ""
    if target is not None:
        hit = next((p for p in requests if p["node"] == target.node and p["dev"] == target.interface
                    and p["dir"] == "egress"), None)
        if hit is not None:
            return {"result": "delivered", "port": target_name, "node": target.node,
                    "reason": f"the probe left {target.node}'s br-int by {target.interface} at +{hit['at_us']:.1f} µs"
                              + (f"; the VM answered it{how}" if answer else "; no answer seen")}
    else:
        hit = next((p for p in requests if (p["node"], p["dev"]) in leaving and p["dir"] == "egress"), None)
        if hit is not None:
            return {"result": "uplink", "node": hit["node"],
                    "reason": f"the probe left the cloud by {hit['dev']} on {hit['node']} at +{hit['at_us']:.1f} µs"
                              + (f"; an answer came back{how}" if answer else "; no answer seen")}
    unknown = "; ".join(f"{n}: {why}" for n, why in live["unknown"].items())
    if not requests:
        return {"result": "unknown", "reason": "the injected probe was seen nowhere (not even at the source port)"
                                               + (f"; not watched: {unknown}" if unknown else "")}
    last = requests[-1]
    if unknown:
        return {"result": "unknown", "reason": f"last seen at {_point(last)}; not watched: {unknown}"}
    where = stages.get(last["node"])
    return {"result": "dropped", "node": last["node"],
            "reason": f"last seen at {_point(last)} (+{last['at_us']:.1f} µs): dropped in {last['node']}'s switches"
                      + (f": {where}" if where else "")}


def annotate(result: dict, live: dict) -> None:
    """The hops of `result`'s walk get the time the probe spent there (`time_us`, its first crossing):
    a switch hop the time from the interface it came in by to the next one it left by on that
    node; a hop outside the switches (a VNF, a router's namespace) from leaving the switches to
    coming back."""
    hops, timed = result["hops"], set()
    outside = _between(result)
    for seg in live["segments"]:
        if seg["packet"] in ANSWERS or "node" not in seg:
            continue
        if seg["where"].startswith("switches of "):
            mine = [h for h in hops if h["name"] == seg["node"] and h["bridge"] in SWITCHES and h["id"] not in timed]
            hop = next((h for h in mine if _dev(h["in_port"]) == seg["dev"]), mine[0] if mine else None)
        else:
            hop = outside.get((seg["node"], seg["dev"]))
        if hop is not None and hop["id"] not in timed:
            hop["time_us"] = seg["us"]
            timed.add(hop["id"])

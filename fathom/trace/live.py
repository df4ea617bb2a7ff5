"""A live trace: the probe (fathom.trace.probe) injected at the source port, seen in the kernel
at every observation point on its path, and the verdict of what it really did.

The controller never runs anything on a host: each node's agent arms its observation points
(`livetrace-watch`: eBPF at TC ingress and egress of the switch interfaces the packet crosses on
that node, native/pptmon/livetrace.c), the source node's agent injects the probe, and every agent
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
from fathom.trace.probe import Probe

PHY_UPLINK = "ul0"             # br-phy's underlay interface (fathom.controller.setups)
SETTLE = 0.15                  # seconds the probe (and the VM's reply) have to cross the cloud
MAX_DEVS = 32


# ask({node: request}) -> {node: the agent's `live` answer, or why it gave none (a str)}: the requests
# are put to all the nodes at once and answered within the trace's deadline
Ask = Callable[[dict[str, dict]], dict[str, "dict | str"]]


def watch_points(walk: dict, source: Port, target: Port) -> dict[str, list[str]]:
    """The interfaces to watch per node: where the simulated walk enters and leaves each node's
    switches (the underlay port for the tunnel and the uplink: their frames cross it), and both
    ends' ports."""
    out: dict[str, list[str]] = {}

    def add(node: str | None, dev: str | None) -> None:
        if node and dev and dev not in out.setdefault(node, []) and len(out[node]) < MAX_DEVS:
            out[node].append(dev)
    add(source.node, source.interface)
    for hop in walk["hops"]:
        if hop["bridge"] not in (BR_INT.bridge, BR_PHY.bridge):
            continue
        for dev in [hop["in_port"], *(o["port"] for o in hop["outputs"])]:
            add(hop["name"], PHY_UPLINK if dev in (TUNNEL_INTERFACE, UPLINK_INTERFACE) else dev)
    add(target.node, target.interface)
    add(target.node, PHY_UPLINK)
    return out


def run(walk: dict, source: Port, target: Port, ttl: int, size: int, ask: Ask, timeout: float = 5.0) -> dict:
    """Inject the probe the simulated `walk` describes and gather its sightings: the `live` part of
    a trace's result (fathom.trace.live.verdict reads it). The observation points end by
    themselves `timeout` seconds after they were attached, collected or not."""
    started = time.monotonic()
    probe, trace = Probe.new(), secrets.token_hex(8)
    pkt = walk["packet"]
    frame = probe.frame(pkt["eth_src"], pkt["eth_dst"], pkt["ipv4_src"], pkt["ipv4_dst"], ttl, size)
    points = watch_points(walk, source, target)
    live: dict = {"probe": {"what": "ICMP echo request (the destination VM answers it; the reply stops at the "
                                    "source port)", "size": size, **probe.to_json()},
                  "source": {"node": source.node, "dev": source.interface},
                  "watched": {}, "not_watched": {}, "unknown": {}, "points": []}
    arm = {node: {"kind": "live-arm", "trace": trace, "probe": probe.to_json(), "devs": devs, "timeout_ms": int(timeout * 1000),
                  **({"drop_reply": source.interface} if node == source.node else {})}
           for node, devs in points.items()}
    armed, took = [], {}
    for node, got in ask(arm).items():
        if isinstance(got, str):
            live["unknown"][node] = got
            continue
        live["watched"][node] = got.get("watched", [])
        if live["watched"][node]:
            armed.append(node)
        if got.get("not_watched"):
            live["not_watched"][node] = got["not_watched"]
    took["arm"] = time.monotonic()
    why = None
    if source.node not in armed:
        why = live["unknown"].get(source.node, "the source node was not armed")
    elif source.interface not in live["watched"].get(source.node, ()):
        why = f"the source port's interface {source.interface} cannot be watched on {source.node}"
    else:
        got = ask({source.node: {"kind": "live-inject", "trace": trace, "dev": source.interface,
                                 "frame": frame.hex()}})[source.node]
        why = got if isinstance(got, str) else None
    live["injected"] = why is None
    took["inject"] = time.monotonic()
    if why is None:
        time.sleep(SETTLE)
    else:
        live["not_injected"] = why
    for node, got in ask({node: {"kind": "live-collect", "trace": trace} for node in armed}).items():
        if isinstance(got, str):
            live["unknown"][node] = got
            continue
        offset = got.get("realtime_offset_ns", 0)
        for s in got.get("seen", ()):
            live["points"].append({"node": node, **s, "t_ns": s["ktime_ns"] + offset})
    took["collect"] = time.monotonic()
    live["points"].sort(key=lambda p: p["t_ns"])
    live["segments"] = _segments(live["points"])
    live["timings_ms"] = {"arm": took["arm"] - started, "inject": took["inject"] - took["arm"],
                          "settle": SETTLE if live["injected"] else 0,
                          "collect": took["collect"] - took["inject"] - (SETTLE if live["injected"] else 0)}
    live["timings_ms"] = {k: round(v * 1000, 1) for k, v in live["timings_ms"].items()}
    return live


def _segments(points: list[dict]) -> list[dict]:
    """The time between consecutive sightings: inside a node's switches (ingress → egress on one
    node), in the underlay between nodes (egress → ingress), in the destination VM (the request out
    of the switch → its reply back in)."""
    start = points[0]["t_ns"] if points else 0
    for p in points:
        p["at_us"] = round((p["t_ns"] - start) / 1000, 3)
    out = []
    for a, b in zip(points, points[1:]):
        if a["dir"] == "injected":
            continue
        if a["node"] == b["node"] and a["dir"] == "ingress" and b["dir"] == "egress":
            where = f"switches of {a['node']}"
        elif a["dir"] == "egress" and b["dir"] == "ingress" and a["icmp_type"] == 8 and b["icmp_type"] == 0 \
                and (a["node"], a["dev"]) == (b["node"], b["dev"]):
            where = f"VM behind {a['dev']} on {a['node']} (answering)"
        elif a["dir"] == "egress" and b["dir"] == "ingress":
            where = f"underlay {a['node']} → {b['node']}"
        else:
            where = f"{_point(a)} → {_point(b)}"
        out.append({"from": _point(a), "to": _point(b), "where": where, "us": round((b["t_ns"] - a["t_ns"]) / 1000, 3),
                    "packet": "reply" if b["icmp_type"] == 0 else "request"})
    return out


def _point(p: dict) -> str:
    return f"{p['dev']} {p['dir']} on {p['node']}"


def verdict(live: dict, target: Port, target_name: str, stages: dict) -> dict:
    """What the probe did: delivered to the destination port (its switch sent it out of the port's
    interface), dropped after the last point that saw it (with the stage the node's own tables
    drop it at, from `stages`: node -> the --actual walk's reason), or unknown."""
    if not live.get("injected"):
        return {"result": "unknown", "reason": f"no probe was injected: {live.get('not_injected')}"}
    requests = [p for p in live["points"] if p["icmp_type"] == 8 and p["dir"] != "injected"]
    hit = next((p for p in requests if p["node"] == target.node and p["dev"] == target.interface
                and p["dir"] == "egress"), None)
    answered = any(p["icmp_type"] == 0 for p in live["points"])
    if hit is not None:
        return {"result": "delivered", "port": target_name, "node": target.node,
                "reason": f"the probe left {target.node}'s br-int by {target.interface} at +{hit['at_us']:.1f} µs"
                          + ("; the VM answered it" if answered else "; no answer seen")}
    if not requests:
        return {"result": "unknown", "reason": "the injected probe was seen nowhere (not even at the source port)"}
    last = requests[-1]
    if live["unknown"]:
        unknown = "; ".join(f"{n}: {why}" for n, why in live["unknown"].items())
        return {"result": "unknown", "reason": f"last seen at {_point(last)}; not watched: {unknown}"}
    where = stages.get(last["node"])
    return {"result": "dropped", "node": last["node"],
            "reason": f"last seen at {_point(last)} (+{last['at_us']:.1f} µs): dropped in {last['node']}'s switches"
                      + (f": {where}" if where else "")}


def annotate(result: dict, live: dict) -> None:
    """Each node's first switch hop of the walk gets the time the probe spent in that node's
    switches (`time_us`: ingress to egress, the request's first crossing)."""
    done = set()
    for seg in live["segments"]:
        node = seg["where"].removeprefix("switches of ")
        if seg["packet"] != "request" or node == seg["where"] or node in done:
            continue
        hop = next((h for h in result["hops"] if h["name"] == node and h["bridge"] in (BR_INT.bridge, BR_PHY.bridge)),
                   None)
        if hop is not None:
            hop["time_us"] = seg["us"]
            done.add(node)

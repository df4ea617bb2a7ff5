"""A switch's own tables, as `ovs-appctl ofproto/trace` reads them: the flow to ask for a trace's
packet (`br_flow`), and the trace's output read back into a pass of the simulation's shape
(`parse`: fathom.trace.tables.Pass), so the walk follows an actual pass as it follows a simulated one.

What is read: each table the packet met in the traced bridge (its number, the priority, match and
cookie of the flow that matched, the actions under it; "No match." is a table miss), in every
recirculation (a `ct(table=N)` resumes the packet with the state given by `--ct-next`); the
ports it was output to (`output:N`, NORMAL, CONTROLLER; an output OVS skipped, to the in_port or a
port that does not exist, is not one); and the packet as it left (`Final flow`: every output of a
pass carries it, as the pass's last header changes apply to all of them). A bridge the trace
crosses into (a patch port) is left out: the walk traces that bridge as a hop of its own.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from fathom.openflow.spec import OFPP_CONTROLLER, OFPP_IN_PORT
from fathom.pipeline.catalogue import OFPP_NORMAL
from fathom.trace import tables as tb

PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp"}
_TO_OVS = {"eth_src": "dl_src", "eth_dst": "dl_dst", "ipv4_src": "nw_src", "ipv4_dst": "nw_dst", "ttl": "nw_ttl",
           "icmpv4_type": "icmp_type", "icmpv4_code": "icmp_code", "tun_ipv4_src": "tun_src",
           "tun_ipv4_dst": "tun_dst", "arp_spa": "arp_spa", "arp_tpa": "arp_tpa", "arp_sha": "arp_sha",
           "arp_tha": "arp_tha", "arp_op": "arp_op"}
_FROM_OVS = {v: k for k, v in _TO_OVS.items()}
_SHORTHAND = {"ip": (0x0800, None), "icmp": (0x0800, 1), "tcp": (0x0800, 6), "udp": (0x0800, 17),
              "arp": (0x0806, None), "ipv6": (0x86DD, None)}
_RESERVED = {"NORMAL": OFPP_NORMAL, "CONTROLLER": OFPP_CONTROLLER, "IN_PORT": OFPP_IN_PORT}

_TABLE = re.compile(r"^(?P<indent> *)(?P<table>\d+)\. (?P<rest>.*)$")
_FLOW = re.compile(r"^(?:(?P<match>.*?), )?priority (?P<priority>\d+)(?:, cookie (?P<cookie>0x[0-9a-f]+))?$")
_BRIDGE = re.compile(r'^bridge\("(?P<name>[^"]+)"\)$')
_SET_TUNNEL = re.compile(r"^\s*set_field:(?P<value>[0-9a-fx.]+)->(?P<field>tun_id|tun_dst)\s*$")
_TUNNEL = {"tun_id": "tunnel_id", "tun_dst": "tun_ipv4_dst"}
_OUTPUT = re.compile(r"^\s*(?:output:(?P<port>\d+|[A-Z_]+)|(?P<reserved>NORMAL|IN_PORT)"
                     r"|(?P<controller>controller)(?:\(.*\))?)\s*$")


def br_flow(pkt: dict) -> str:
    """The packet as ofproto/trace's `br_flow`: in_port, tunnel metadata, VLAN, Ethernet, IPv4 and
    the transport header (fields it does not give are zero, as OVS takes them)."""
    words = [f"in_port={int(pkt['in_port'])}"]
    if pkt.get("tunnel_id"):
        words.append(f"tun_id={int(pkt['tunnel_id']):#x}")
    for name in ("tun_ipv4_src", "tun_ipv4_dst"):
        if pkt.get(name):
            words.append(f"{_TO_OVS[name]}={ipaddress.IPv4Address(pkt[name])}")
    eth_type, proto = pkt.get("eth_type"), pkt.get("ip_proto")
    if eth_type == 0x0800 and proto in PROTOCOLS:
        words.append(PROTOCOLS[proto])
    elif eth_type == 0x0800:
        words += ["ip", f"nw_proto={int(proto or 0)}"]
    elif eth_type is not None:
        words.append(f"dl_type={int(eth_type):#06x}")
    if pkt.get("vlan") is not None:
        words.append(f"dl_vlan={int(pkt['vlan'])}")
    for name in ("eth_src", "eth_dst", "ipv4_src", "ipv4_dst", "ttl", "icmpv4_type", "icmpv4_code"):
        if pkt.get(name) is not None:
            words.append(f"{_TO_OVS[name]}={_plain(name, pkt[name])}")
    for side in ("src", "dst"):
        port = pkt.get(f"tcp_{side}", pkt.get(f"udp_{side}"))
        if port is not None:
            words.append(f"tp_{side}={int(port)}")
    return ",".join(words)


def _plain(name: str, value) -> str:
    if name in ("eth_src", "eth_dst"):
        return ":".join(f"{int(b, 16):02x}" for b in str(value).split(":"))
    if name in ("ipv4_src", "ipv4_dst"):
        return str(ipaddress.IPv4Address(value))
    return str(int(value))


@dataclass(frozen=True)
class TracedFlow:
    """The flow a trace says matched: what the walk reads of a FlowSpec, as OVS printed it."""
    table: int
    priority: int
    match: str
    actions_text: str
    cookie: int = 0

    @property
    def actions(self) -> tuple:
        """Non-empty unless the flow drops (the walk asks only that)."""
        return () if self.actions_text == "drop" else (self.actions_text,)


def packet(text: str) -> dict:
    """A flow as OVS prints it (`Flow:`, `Final flow:`) as a packet of the walk's fields."""
    out: dict = {"vlan": None}
    proto = None
    for word in text.split(","):
        name, _, value = word.strip().partition("=")
        if not value:
            if name in _SHORTHAND:
                out["eth_type"], p = _SHORTHAND[name]
                if p is not None:
                    out["ip_proto"] = proto = p
            continue
        if name in _FROM_OVS:
            key = _FROM_OVS[name]
            out[key] = value if key in tb._MAC or key in tb._IPV4 else int(value, 0)
        elif name in ("tp_src", "tp_dst"):
            out[(name, proto)] = int(value, 0)
        elif name == "dl_type":
            out["eth_type"] = int(value, 0)
        elif name == "nw_proto":
            out["ip_proto"] = proto = int(value, 0)
        elif name == "vlan_tci":
            tci = int(value.split("/")[0], 0)
            out["vlan"] = tci & 0xFFF if tci & 0x1000 else None
        elif name == "dl_vlan":
            out["vlan"] = int(value, 0)
        elif name == "tun_id":
            out["tunnel_id"] = int(value, 0)
        elif name == "in_port" or name == "metadata" or re.fullmatch(r"reg\d+", name):
            try:
                out[name] = int(value, 0)
            except ValueError:      # a port by name: not what the walk needs
                pass
    proto = out.get("ip_proto")
    for key in [k for k in out if isinstance(k, tuple)]:
        name, _ = key
        if proto in (6, 17):
            out[f"{PROTOCOLS[proto]}_{name[3:]}"] = out[key]
        del out[key]
    return out


def parse(text: str, bridge: str) -> tb.Pass:
    """ofproto/trace's output for `bridge` as a pass: its steps (tables met, `flow` a TracedFlow or
    None for a miss), the packets output (with the final flow's headers) and, when nothing left
    the bridge, where the packet ended."""
    p = tb.Pass()
    flows: list[dict] = []                    # each recirculation's packet as it came in
    finals: list[dict] = []                   # ... and as it left
    here = False
    tunnel: dict = {}                          # tunnel metadata the actions set (Final flow omits tun_id)
    outputs: list[tuple[int, int, int, dict]] = []    # (port, step index, section, tunnel then)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Flow: "):
            flows.append(packet(line[len("Flow: "):]))
            continue
        if line.startswith("Final flow: "):
            rest = line[len("Final flow: "):]
            finals.append(flows[-1] if rest.strip() == "unchanged" or not flows else packet(rest))
            here = False
            continue
        m = _BRIDGE.match(line.strip())
        if m:
            here = m.group("name") == bridge
            continue
        if not here:
            continue
        m = _TABLE.match(line)
        if m:
            p.steps.append(_step(m, lines, i + 1))
            continue
        if not p.steps:
            continue
        m = _SET_TUNNEL.match(line)
        if m:
            tunnel[_TUNNEL[m.group("field")]] = m.group("value") if m.group("field") == "tun_dst" \
                else int(m.group("value"), 0)
            continue
        m = _OUTPUT.match(line)
        if m:
            port = m.group("port") or m.group("reserved")
            number = OFPP_CONTROLLER if m.group("controller") else (
                int(port) if port.isdigit() else _RESERVED.get(port))
            skipped = i + 1 < len(lines) and lines[i + 1].strip().startswith(">>")
            if number is not None and not skipped:
                outputs.append((number, len(p.steps) - 1, len(flows) - 1, dict(tunnel)))
    for port, step, section, tun in outputs:
        at = finals[section] if section < len(finals) else flows[section]
        p.out.append(tb.Emitted(port, {**at, **tun}, step))
    if not outputs and p.steps:
        last = len(p.steps) - 1
        f = p.steps[last].flow
        why = ("no flow matched (table miss: drop)" if f is None or f.priority == 0 and not f.actions
               else "the flow drops it" if not f.actions else "the flow's actions send it nowhere")
        p.ends.append((last, why, dict(finals[-1] if finals else flows[-1] if flows else {})))
    return p


def _step(m: re.Match, lines: list[str], i: int) -> tb.Step:
    """A table line and the action lines under it (indented deeper, up to the next table line)."""
    table, rest = int(m.group("table")), m.group("rest").strip()
    indent = max(0, len(m.group("indent")) + len(m.group("table")) - 2)    # OVS right-aligns the number: "%2d."
    actions = []
    for line in lines[i:]:
        if not line.strip() or _TABLE.match(line) or not line.startswith(" " * (indent + 4)):
            break
        text = line.strip()
        if not text.startswith(("->", ">>")):
            actions.append(text)
    depth = indent // 4
    if rest.startswith("No match"):
        return tb.Step(table, None, depth)
    f = _FLOW.match(rest)
    if f is None:
        return tb.Step(table, None, depth, [f"not read: {rest[:200]}"])
    return tb.Step(table, TracedFlow(table, int(f.group("priority")), f.group("match") or "",
                                     ",".join(actions) or "drop", int(f.group("cookie") or "0", 16)), depth)

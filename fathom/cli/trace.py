"""`fathom trace PORT --to IP|PORT`: where one packet goes, switch by switch and stage by stage
(docs/trace.md)."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import click

from fathom.cli.output import console, plain, print_json, print_table
from fathom.cli.resources import Api
from fathom.client import DEFAULT_CONTROLLER
from fathom.trace import svg
from fathom.trace.walk import passed_through


@click.command()
@click.argument("port_ref")
@click.option("--to", "to", required=True, help="Destination: an IPv4 address, or a port (id or name).")
@click.option("--proto", type=click.Choice(["icmp", "tcp", "udp"]), default="icmp", show_default=True)
@click.option("--dport", type=click.IntRange(1, 65535), help="Destination port (tcp, udp: required).")
@click.option("--sport", type=click.IntRange(1, 65535), help="Source port (tcp, udp; default 49152).")
@click.option("--ct-state", type=click.Choice(["new", "established"]), default="new", show_default=True,
              help="The conntrack state every ct lookup is assumed to find (a simulation cannot know it).")
@click.option("--ttl", type=click.IntRange(1, 255), default=64, show_default=True)
@click.option("--actual", is_flag=True,
              help="Trace each node's own tables (its agent runs ovs-appctl ofproto/trace) and show where they "
                   "differ from the desired ones when the verdicts differ.")
@click.option("--live", is_flag=True,
              help="Inject a marked ICMP echo (--proto tcp: a TCP SYN) at the source port (by its node's agent) "
                   "and follow it: where it "
                   "really went, with kernel times at each hop; stages from the desired state, or from each "
                   "node's own tables with --actual and when the probe did not arrive.")
@click.option("--size", type=click.IntRange(28, 9216), default=84, show_default=True,
              help="With --live: bytes of the echo's IP packet (a TCP probe is a bare SYN).")
@click.option("--timeout", type=click.FloatRange(0.5, 20), default=5.0, show_default=True,
              help="With --actual or --live: seconds the agents have to answer, in all.")
@click.option("--svg", "svg_file", type=click.Path(dir_okay=False, writable=True),
              help="Also draw the path hop by hop into this SVG file.")
@click.option("--controller", envvar="FATHOM_CONTROLLER", default=DEFAULT_CONTROLLER, show_default=True,
              help="URL of the fathom controller (env FATHOM_CONTROLLER).")
@click.option("--project", envvar="FATHOM_PROJECT", default=None,
              help="Service tokens: the project to act for (X-Project).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def trace(port_ref, to, proto, dport, sport, ct_state, ttl, actual, live, size, timeout, svg_file, controller, project,
          as_json):
    """Trace a packet from PORT_REF (id or name) through the pipelines of every switch it reaches:
    each switch, each stage, the flow that matched and its owner, the actions, and the verdict
    (delivered to a port, dropped and why, or sent out the uplink). A simulation over the desired
    state; with --actual, through each node's own tables; with --live, a real probe too."""
    api = Api(controller, project)
    body = {"port_id": api.find("ports", port_ref)["id"], "proto": proto, "ct_state": ct_state, "ttl": ttl,
            **({"dport": dport} if dport is not None else {}), **({"sport": sport} if sport is not None else {}),
            **({"actual": True, "timeout": timeout} if actual else {}),
            **({"live": True, "timeout": timeout, **({"size": size} if proto == "icmp" else {})} if live else {})}
    try:
        body["to_ip"] = str(ipaddress.IPv4Address(to))
    except ValueError:
        body["to_port_id"] = api.find("ports", to)["id"]
    result = api.call("POST", "/traces", json=body)
    if svg_file:
        Path(svg_file).write_text(svg.render(result))
    if as_json:
        print_json(result)
        return
    show(result)


def show(result: dict) -> None:
    """A trace as a table: one row per stage of each hop, then the leaves and the verdict."""
    pkt = result["packet"]
    console.print(plain(f"{result['source']['port']} ({result['source']['ip']}) → {result['to']['ip']}"
                        + (f" ({result['to']['port']})" if result["to"]["port"] else "")
                        + f": {_packet(pkt)}; ct_state assumed {result['assumptions']['ct_state']}"))
    console.print(plain(f"source VM: {result['next_hop']}"))
    rows = []
    for hop in result["hops"]:
        where = f"#{hop['id']} {hop['switch']} (in {hop['in_port']}"
        where += f", from #{hop['from']})" if hop["from"] is not None else ")"
        if hop.get("tables") and hop["tables"] != "actual":
            where += f" [tables: {hop['tables']}]"
        if not any(not passed_through(s) for s in hop["steps"]):
            rows.append([where, "", "", "", "", ""])
        for i, s in enumerate(s for s in hop["steps"] if not passed_through(s)):
            owner = s.get("owner")
            owned = "" if not owner else f"{owner['kind']} {owner.get('name', owner['id'])}"
            notes = "; ".join(s.get("notes", ()))
            rows.append([where if i == 0 else "", s["stage"], s.get("priority", "") or "",
                         s.get("match") or "", s["actions"] + (f" [{notes}]" if notes else ""), owned])
        if hop["outputs"]:
            rows.append(["", "→ out", "", "", ", ".join(o["port"] for o in hop["outputs"]), ""])
        for d in hop.get("differs", ()):
            rows.append(["", f"≠ {d['stage']}", "", "", f"desired {d['desired']}; actual {d['actual']}", ""])
    print_table(f"trace (tables: {result['assumptions']['state']}; stages a table-miss flow passes on are left out, "
                "--json has them)", ["switch", "stage", "prio", "match", "actions", "owner"],
                rows)
    for leaf in result["leaves"]:
        console.print(plain(f"  {leaf['result']}: {leaf['detail']}"
                            + (f" (at #{leaf['hop']})" if leaf["hop"] is not None else "")))
    for name in ("desired", "actual"):
        if name not in result:
            continue
        d = result[name]["verdict"]
        console.print(plain(f"{name} verdict: {d['result']}" + (f" to {d['port']} on {d['node']}" if d.get("port")
                                                                   else "")))
    if result.get("difference"):
        console.print(plain(f"difference: {result['difference']['reason']}"))
    if "live" in result:
        _show_live(result)
    v = result["verdict"]
    console.print(plain(f"verdict: {v['result']}" + (f" to {v['port']} on {v['node']}" if v.get("port") else "")
                        + f" — {v['reason']}"))


def _show_live(result: dict) -> None:
    live = result["live"]
    p = live["probe"]
    console.print(plain(f"live probe: {p['what']}; {p['size']} bytes, DSCP {p['dscp']}, IP ID {p['ip_id']}, "
                        + (f"TCP seq {p['tcp_seq']}" if "tcp_seq" in p else f"ICMP id {p['icmp_id']} seq {p['icmp_seq']}")
                        + f"; answered in {live['answer_ms']} ms"))
    rows = [[f"+{pt['at_us']:.1f}", pt["node"], pt["dev"], pt["dir"], pt["packet"],
             (f"VNI {pt['vxlan']['vni']} " if pt.get("vxlan") else "") + (f"VLAN {pt['vlan']}" if "vlan" in pt else "")]
            for pt in live["points"]]
    print_table("live: where the kernel saw the probe", ["µs", "node", "interface", "hook", "packet", "on the wire"],
                rows)
    print_table("live: time between sightings", ["µs", "where", "packet"],
                [[f"{s['us']:.1f}", s["where"], s["packet"]] for s in live["segments"]])
    for node, why in live["unknown"].items():
        console.print(plain(f"  not watched on {node}: {why}"))


def _packet(pkt: dict) -> str:
    proto = {1: "icmp", 6: "tcp", 17: "udp"}.get(pkt.get("ip_proto"), str(pkt.get("ip_proto")))
    ports = next((f" {pkt[f'{p}_src']} → {pkt[f'{p}_dst']}" for p in ("tcp", "udp") if f"{p}_dst" in pkt), "")
    return f"{proto}{ports} ttl {pkt.get('ttl')}"

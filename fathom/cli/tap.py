"""`fathom tap create|list|show|update|delete|capture`: vTAP policies over the REST API.

An identifier (--sender, --receiver, --monitor, --monitor2) is a port id, a port name, or MAC,IP
(e.g. 02:fa:00:00:01:01,198.19.1.11). Filters, named as in the API: --ip-proto, --vlan, --tp-src,
--tp-dst (a port or a range 1000-2000), --match FIELD=VALUE (repeatable; further OpenFlow 1.3
fields); `*` = wildcard. --sender or --receiver `*`: anyone (what the receiver port receives, or
everything the sender port sends). --direction forward|both as in the API.
"""
from __future__ import annotations

import sys

import click

from fathom.agent.capture import whole_records
from fathom.cli.output import console, fail, plain, print_json, print_record, print_table
from fathom.cli.resources import Api, api_command, project_id_option
from fathom.client import ApiError


@click.group()
def tap():
    """vTAP: copy one VM's traffic to a monitor VM (OpenFlow group ALL at the sender's switch)."""


def _ref(value: str | None):
    if value is None:
        return None
    if "," in value:
        mac, _, ip = value.partition(",")
        return {"mac": mac.strip(), "ip": ip.strip()}
    return int(value) if value.isdigit() else value


def _find(api: Api, ref: str) -> dict:
    return api.find("taps", ref)


def _matches(items: tuple[str, ...]) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            fail(f"--match {item!r}: use FIELD=VALUE, e.g. ip_dscp=46")
        out[name.strip()] = value.strip()
    return out


def _who(e: dict | None) -> str:
    if not e:
        return ""
    if e.get("port_name") or e.get("port_id"):
        return f"{e.get('port_name') or e['port_id']}" + (f"@{e['node']}" if e.get("node") else "")
    if e.get("mac") is None:
        return "(deleted)"
    if e.get("mac") == "*":
        return "*"
    return f"{e['mac']},{e['ip']}"


def _filters(t: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in t["filters"].items()) or "*"


def _status(t: dict) -> str:
    return t["status"] + (f" ({t['status_reason']})" if t.get("status_reason") else "")


filter_options = [
    click.option("--ip-proto", "ip_proto", help="IP protocol: number, tcp, udp, icmp, sctp or *."),
    click.option("--vlan", help="VLAN id (the network's VLAN, or the VM's own tag) or *."),
    click.option("--tp-src", "tp_src", help="TCP/UDP source port or range (1000-2000) or *."),
    click.option("--tp-dst", "tp_dst", help="TCP/UDP destination port or range or *."),
    click.option("--match", "match", multiple=True, help="FIELD=VALUE, an OpenFlow 1.3 field (repeatable)."),
]


def _with(options):
    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def _body(ip_proto, vlan, tp_src, tp_dst, match) -> dict:
    body = {}
    for key, value in (("ip_proto", ip_proto), ("vlan", vlan), ("tp_src", tp_src), ("tp_dst", tp_dst)):
        if value is not None:
            body[key] = int(value) if value.isdigit() else value
    if match:
        body["match"] = _matches(match)
    return body


@api_command(tap, "create")
@click.argument("name", required=False, default="")
@click.option("--sender", required=True,
              help="Port (id or name) or MAC,IP whose traffic is copied; * = anyone (what the receiver port receives).")
@click.option("--receiver", required=True,
              help="Port or MAC,IP the traffic goes to; * = anyone (everything the sender sends).")
@click.option("--monitor", required=True, help="Port that receives the copies.")
@click.option("--monitor2", help="A second monitor port for the same copies.")
@click.option("--direction", type=click.Choice(["forward", "both"]), default="forward", show_default=True,
              help="both: also copy receiver -> sender.")
@click.option("--priority", type=int, default=100, show_default=True,
              help="Where policies overlap, the higher priority copies (0..60000).")
@project_id_option("policy")
@click.option("--truncate", type=int, help="Copies keep at most N bytes (64..65535).")
@click.option("--rate-pps", type=int, help="At most N copies per second (OpenFlow meter at the sender's switch).")
@_with(filter_options)
def tap_create(api, as_json, name, sender, receiver, monitor, monitor2, direction, priority, project_id, truncate, rate_pps,
               ip_proto, vlan, tp_src, tp_dst, match):
    """Create a TAP policy."""
    body = {"name": name, "sender": _ref(sender), "receiver": _ref(receiver), "monitor": _ref(monitor),
            "direction": direction, "priority": priority,
            **_body(ip_proto, vlan, tp_src, tp_dst, match)}
    if monitor2:
        body["monitor2"] = _ref(monitor2)
    if truncate:
        body["truncate"] = truncate
    if rate_pps:
        body["rate_pps"] = rate_pps
    if project_id:
        body["project_id"] = project_id
    _print(api.call("POST", "/taps", json=body), as_json)


@api_command(tap, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--sender")
@click.option("--receiver")
@click.option("--monitor")
@click.option("--monitor2", help="A second monitor; 'none' removes it.")
@click.option("--direction", type=click.Choice(["forward", "both"]))
@click.option("--priority", type=int)
@click.option("--truncate", type=int, help="Copies keep at most N bytes; 0 = whole frames.")
@click.option("--rate-pps", type=int, help="At most N copies per second; 0 = no limit.")
@_with(filter_options)
def tap_update(api, as_json, ref, name, sender, receiver, monitor, monitor2, direction, priority, truncate, rate_pps,
               ip_proto, vlan, tp_src, tp_dst, match):
    """Change a TAP policy in place (its flows and group are modified, not re-created)."""
    t = _find(api, ref)
    body = _body(ip_proto, vlan, tp_src, tp_dst, match)
    for key, value in (("name", name), ("direction", direction), ("priority", priority), ("truncate", truncate),
                       ("rate_pps", rate_pps)):
        if value is not None:
            body[key] = value
    for key, value in (("sender", sender), ("receiver", receiver), ("monitor", monitor)):
        if value is not None:
            body[key] = _ref(value)
    if monitor2 is not None:
        body["monitor2"] = None if monitor2.lower() == "none" else _ref(monitor2)
    _print(api.call("PATCH", f"/taps/{t['id']}", json=body), as_json)


@api_command(tap, "list")
def tap_list(api, as_json):
    """List TAP policies with their counters: copies made at senders' switches, copies delivered to
    monitors (packets and bytes, read from the switches)."""
    taps = api.list("/taps")
    stats = {t["id"]: _stats(api, t["id"]) for t in taps}
    if as_json:
        return print_json([{**t, "stats": stats[t["id"]]} for t in taps])

    def counter(t, key):
        st = stats[t["id"]]
        return "-" if st is None else st[key]

    rows = [[t["id"], t["name"], t["project_id"], _who(t["sender"]), _who(t["receiver"]),
             " ".join(filter(None, (_who(t["monitor"]), _who(t.get("monitor2"))))),
             t["direction"], t["priority"], _filters(t), _status(t), counter(t, "copies_packets"),
             counter(t, "copies_bytes"), counter(t, "delivered_packets")] for t in taps]
    print_table("tap policies", ["id", "name", "project", "sender", "receiver", "monitor",
                                 "direction", "priority", "filters", "status", "copies pkts",
                                 "copies bytes", "delivered pkts"], rows)


def _stats(api: Api, tap_id: int):
    """Runtime counters and per-node state, when the controller serves them (else None)."""
    try:
        return api.tap_stats(tap_id)
    except ApiError:   # counters are optional in `show` (an API served without the controller runtime)
        return None


def _print(t: dict, as_json: bool, stats: dict | None = None) -> None:
    if as_json:
        return print_json({**t, **({"stats": stats} if stats else {})})
    rec = {k: v for k, v in t.items() if k not in ("sender", "receiver", "monitor", "monitor2", "filters")}
    rec.update(sender=_who(t["sender"]), receiver=_who(t["receiver"]), monitor=_who(t["monitor"]),
               monitor2=_who(t.get("monitor2")), filters=_filters(t))
    print_record(f"tap policy {t['id']}", rec)
    if stats:
        rows = [[n["node"], ", ".join(n["roles"]), n["switch"], n["flows_installed"], n["flows_desired"],
                 n.get("copies_packets", ""), n.get("copies_bytes", ""), n.get("delivered_packets", "")]
                for n in stats["nodes"]]
        print_table("per node", ["node", "roles", "switch", "flows", "of", "copies pkts", "copies bytes",
                                 "delivered pkts"], rows)
        console.print(f"copies: {stats['copies_packets']} packets, {stats['copies_bytes']} bytes; "
                      f"delivered to monitors: {stats['delivered_packets']} packets", highlight=False)


@api_command(tap, "show")
@click.argument("ref")
def tap_show(api, as_json, ref):
    """Show a TAP policy with its counters and per-node state (by id or name)."""
    t = _find(api, ref)
    _print(t, as_json, _stats(api, t["id"]))


@api_command(tap, "delete")
@click.argument("ref")
def tap_delete(api, as_json, ref):
    """Delete a TAP policy (its flows and groups go with it)."""
    t = _find(api, ref)
    api.call("DELETE", f"/taps/{t['id']}")
    console.print(plain(f"deleted tap policy {t['id']}" + (f" ({t['name']})" if t.get("name") else "")))


@api_command(tap, "capture")
@click.argument("ref")
@click.option("-w", "--write", "path", required=True, type=click.Path(dir_okay=False), help="pcap file to write.")
@click.option("-c", "--count", type=int, help="Stop after N packets.")
@click.option("--duration", type=float, default=5.0, show_default=True, help="Capture for at most S seconds (≤ 30).")
@click.option("--max-bytes", type=int, help="At most this many bytes of pcap (≤ 512 KiB, the default).")
@click.option("--monitor2", "second", is_flag=True, help="Capture at the second monitor.")
def tap_capture(api, as_json, ref, path, count, duration, max_bytes, second):
    """Record what the policy's monitor receives to a pcap file (tcpdump on the monitor's port, run by
    its node's agent: POST /v1/taps/{id}/capture)."""
    t = _find(api, ref)
    monitor = "monitor2" if second else "monitor"
    body = {"seconds": duration, "monitor": monitor, **({"count": count} if count is not None else {}),
            **({"max_bytes": max_bytes} if max_bytes is not None else {})}
    data = api.call("POST", f"/taps/{t['id']}/capture", json=body, raw=True, timeout=duration + 30)
    _, packets = whole_records(data, len(data))
    with open(path, "wb") as f:
        f.write(data)
    port = (t.get(monitor) or {}).get("port_name") or monitor
    if as_json:
        print_json({"policy": t["id"], "monitor": port, "file": path, "packets": packets, "bytes": len(data)})
    else:
        console.print(plain(f"{path}: {packets} packets, {len(data)} bytes (monitor {port})"), highlight=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(tap())

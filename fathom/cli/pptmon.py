"""`fathom pptmon`: service chains in namespaces and in-band packet processing time."""
from __future__ import annotations

import json
import sys
import time

import click

from fathom.cli.output import fail, print_json, print_table
from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, stats


def _guard(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except (chainmod.ChainError, ValueError) as e:
        fail(str(e))


@click.group()
def pptmon():
    """Per-VNF and end-to-end packet processing time, carried in-band by eBPF."""


def _attachments():
    from fathom.cli.pptmon_attachment import pptmon_attachment
    return pptmon_attachment


pptmon.add_command(_attachments())


@pptmon.group("chain")
def chain_group():
    """Service chains of VNF namespaces between a client and a server."""


@chain_group.command("up")
@click.argument("name")
@click.option("--vnfs", default="forward", show_default=True,
              help="comma-separated VNFs: firewall[:RULES] (fw), nat, forward (fwd)")
@click.option("--base", default=200, show_default=True, help="first link is 198.18.BASE.0/24")
@click.option("--headroom", default=64, show_default=True, help="extra MTU on VNF links")
@click.option("--offloads/--no-offloads", default=True, show_default=True,
              help="TX checksum, TSO and GSO on every veth")
@click.option("--json", "as_json", is_flag=True)
def chain_up(name, vnfs, base, headroom, offloads, as_json):
    """Create chain NAME (namespaces NAME-client, NAME-vnfK, NAME-server, NAME-host)."""
    c = chainmod.Chain(name=name, vnfs=_guard(chainmod.parse_vnfs, vnfs), base=base,
                       headroom=headroom, offloads=offloads)
    _guard(chainmod.up, c)
    if as_json:
        print_json(c.to_json())
    else:
        click.echo(f"chain {name}: client {c.client_ip} -> "
                   + " -> ".join(v.label() for v in c.vnfs) + f" -> server {c.server_ip}")


@chain_group.command("down")
@click.argument("name")
def chain_down(name):
    """Stop PPTMon on chain NAME and delete its namespaces."""
    removed = _guard(control.down, name)
    click.echo(f"removed {len(removed)} namespaces")


@chain_group.command("list")
@click.option("--json", "as_json", is_flag=True)
def chain_list(as_json):
    chains = chainmod.list_chains()
    rows = []
    for c in chains:
        st = control.state(c)
        rows.append({"name": c.name, "vnfs": [v.label() for v in c.vnfs], "server": c.server_ip,
                     "offloads": c.offloads,
                     "pptmon": None if not st else {"placement": st["placement"],
                                                    "period_ns": st["period_ns"]}})
    if as_json:
        print_json(rows)
        return
    print_table("chains", ["name", "vnfs", "server", "offloads", "pptmon"],
                [[r["name"], ",".join(r["vnfs"]), r["server"], r["offloads"],
                  "off" if not r["pptmon"] else
                  f"{r['pptmon']['placement']} every {r['pptmon']['period_ns'] / 1e6:g} ms"]
                 for r in rows])


@pptmon.command("enable")
@click.argument("chain")
@click.option("--period", default="1s", show_default=True,
              help="sampling period at the source: 1s, 100ms, 20/s, 0 = every packet")
@click.option("--placement", type=click.Choice(control.PLACEMENTS), default="guest",
              show_default=True, help="guest: inside the VNF; host: host side of its veths")
@click.option("--mtu", default=0, help="L3 MTU to keep when growing (0: the device's)")
def enable(chain, period, placement, mtu):
    """Attach PPTMon to every VNF of CHAIN (VNF 1 source, last VNF sink)."""
    ns = _guard(control.parse_period, period)
    st = _guard(control.enable, chain, ns, placement, mtu)
    click.echo(f"pptmon on {chain}: {placement} mode, {', '.join(st['modes'])}, "
               f"period {ns / 1e6:g} ms")


@pptmon.command("disable")
@click.argument("chain")
def disable(chain):
    """Detach PPTMon from CHAIN (only our filters are removed)."""
    n = _guard(control.disable, chain)
    click.echo(f"stopped {n} loaders")


@pptmon.command("stats")
@click.argument("chain")
@click.option("--since", default=None, help="only records of the last DURATION (e.g. 30s)")
@click.option("--controller", default=None,
              help="ask the controller at URL (records delivered by `fathom agent`) instead of "
                   "reading this node's record files; window default 5m")
@click.option("--node", default=None, help="with --controller: the records this node reported (default: every node's)")
@click.option("--json", "as_json", is_flag=True)
def stats_cmd(chain, since, controller, node, as_json):
    """p50 / p90 / p99 processing time per VNF and end to end."""
    if controller:
        return _stats_from_controller(chain, since, controller, node, as_json)
    c = _guard(chainmod.load, chain)
    since_ns = 0
    if since:
        since_ns = time.time_ns() - _guard(control.parse_period, since)
    recs = control.records(chain, since_ns)
    s = stats.chain_stats(recs)
    counters = control.counters(chain)
    if as_json:
        print_json({"chain": chain, **s, "counters": counters})
        return
    _print_stats(chain, s, c)


def _print_stats(chain, s, c, source=""):
    rows = []

    def fmt(x):
        return "" if x is None else f"{x:.1f}"
    for k, v in s["vnfs"].items():
        k = int(k)
        kind = c.vnfs[k - 1].label() if c is not None and 1 <= k <= c.n else ""
        rows.append([f"vnf{k}", kind, v["count"], fmt(v.get("p50_us")), fmt(v.get("p90_us")),
                     fmt(v.get("p99_us")), fmt(v.get("mean_us")), fmt(v.get("max_us"))])
    e = s["e2e"]
    rows.append(["end-to-end", "sum", e["count"], fmt(e.get("p50_us")), fmt(e.get("p90_us")),
                 fmt(e.get("p99_us")), fmt(e.get("mean_us")), fmt(e.get("max_us"))])
    print_table(f"pptmon {chain}: {s['records']} records{source} (µs)",
                ["vnf", "kind", "n", "p50", "p90", "p99", "mean", "max"], rows)


def _stats_from_controller(chain, since, controller, node, as_json):
    from fathom.cli.resources import Api

    params = {"chain": chain}
    if since:
        params["window"] = since
    if node:
        params["node"] = node
    s = Api(controller).call("GET", "/pptmon/stats", params=params)
    if as_json:
        print_json(s)
        return
    try:
        c = chainmod.load(chain)   # VNF kinds, when the chain is described on this host
    except (chainmod.ChainError, OSError, ValueError):
        c = None
    _print_stats(chain, s, c, source=f" at {controller}")


@pptmon.command("records")
@click.argument("chain")
@click.option("--last", default=20, show_default=True)
@click.option("--controller", default=None, help="the records stored by the controller at URL")
@click.option("--vnf", type=int, default=None, help="with --controller: records through this VNF id")
@click.option("--since", default=None, help="with --controller: the last DURATION (30s, 5m) or a time")
@click.option("--node", default=None, help="with --controller: the records this node reported")
def records_cmd(chain, last, controller, vnf, since, node):
    """The last sink records of CHAIN as JSON lines (the format sent to the controller)."""
    if controller:
        from fathom.cli.resources import Api
        params = {"chain": chain, "limit": last}
        params.update({k: v for k, v in (("vnf", vnf), ("since", since), ("node", node)) if v is not None})
        recs = Api(controller).call("GET", "/pptmon/records", params=params)
    else:
        recs = control.records(chain)[-last:]
    for r in recs:
        sys.stdout.write(json.dumps(r) + "\n")


# `fathom bench pptmon`: the benchmark's command joins the shared `bench` group (this module
# is imported by fathom/cli/main.py after that group exists).
try:
    from fathom.bench.pptmon import bench_pptmon as _bench_pptmon
    from fathom.cli.bench import bench as _bench

    if "pptmon" not in _bench.commands:
        _bench.add_command(_bench_pptmon, "pptmon")
except ImportError:  # a checkout without the bench group
    pass

if __name__ == "__main__":
    pptmon()

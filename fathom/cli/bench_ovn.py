"""`fathom bench ovn-compare`: added to the `bench` group of fathom/cli/bench.py."""
from __future__ import annotations

import os

import click

from fathom.cli.bench import bench, output_dir, publish, stderr_progress
from fathom.cli.output import fail


@bench.command("ovn-compare")
@click.option("--quick", is_flag=True, help="QUICK: 1 repeat of 2 s, 5 ports per cell, batches of 20, 15 s at rest "
                                           "(with --replicas: 1 round of 5 ports)")
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved iperf3 repeats of each path and system")
@click.option("--ports", type=click.IntRange(1, 50), default=20, show_default=True,
              help="ports measured per plug order, tenant size and system (p50/p99 over these)")
@click.option("--seconds", type=click.IntRange(2, 60), default=5, show_default=True, help="length of each iperf3 run")
@click.option("--batch", type=click.IntRange(1, 100), default=50, show_default=True,
              help="ports per batch; two batches grow the tenant from 4 to 4 + 2 × batch ports")
@click.option("--window", "window_s", type=float, default=30.0, show_default=True,
              help="CPU window from a batch's first API call, seconds")
@click.option("--rest", "rest_s", type=float, default=60.0, show_default=True,
              help="CPU at rest, seconds, at each tenant size (0: skip)")
@click.option("--small-only", is_flag=True, help="only the 4-port tenant (no batches, no large tenant)")
@click.option("--shape", type=click.Choice(["two-networks", "one-network"]), default="two-networks", show_default=True,
              help="how the batches grow the tenant: extra ports alternating between blue and green, or all in "
                   "blue (one network, one security group)")
@click.option("--replicas", type=click.IntRange(1, 5), default=1, show_default=True,
              help="above 1: no OVN; fathom with one controller against fathom with this many replicas "
                   "(`fathom controller --cluster`), both on a PostgreSQL the bench starts: port API call → "
                   "active and → first echo, --ports ports in each of --repeats interleaved rounds")
@click.option("--stop-others", is_flag=True,
              help="with --replicas: once the leases settle, stop (SIGSTOP) every replica but the master of the "
                   "measured ports' switch and measure through it alone, holding every lease: the cluster's own "
                   "work on a port's path without the other replicas' passes on the same cores")
@click.option("--prefix", default="ov", show_default=True,
              help="lab names: <prefix>f (fathom) and <prefix>o (OVN), or with --replicas N <prefix>1 and "
                   "<prefix>N; ≤ 6 characters")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="default results/bench-ovn-compare-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def ovn_compare(quick, repeats, ports, seconds, batch, window_s, rest_s, small_only, shape, replicas, stop_others, prefix,
                outdir, as_json):
    """The same lab under fathom and under OVN 23.03: TCP throughput, port up → reported up and → first
    echo (and first echo − reported up) in three plug orders at two tenant sizes, control-plane CPU (batch, window, at rest), RSS and
    flows per node. With --replicas N: fathom with one controller against fathom with N replicas instead.
    Progress on stderr; results.json, summary.md (and ovn-compare.png) in the output dir."""
    from fathom.bench import ovn, ovncompare
    from fathom.bench.report import busy
    from fathom.lab.sh import LabError, require_root_and_tools
    if quick:
        repeats, ports, seconds, batch, window_s, rest_s = 1, 5, 2, 20, 15.0, 15.0
    if len(prefix) > 6:
        raise click.BadParameter("at most 6 characters (lab names are ≤ 8)", param_hint="--prefix")
    try:
        require_root_and_tools(("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool", "iperf3", "ping"))
        if replicas == 1:
            ovn.require()
    except LabError as e:
        fail(str(e), code=2)
    out = output_dir("ovn-compare", outdir)
    if replicas > 1:
        b = ovncompare.ClusterBench(prefix=prefix, replicas=replicas, repeats=repeats, ports=ports,
                                    stop_others=stop_others, progress=stderr_progress())
    else:
        b = ovncompare.Bench(prefix=prefix, repeats=repeats, ports=ports, seconds=seconds, batch=batch,
                             window_s=window_s, rest_s=rest_s, large=not small_only, shape=shape,
                             progress=stderr_progress())
    try:
        doc = b.run()
    except (LabError, OSError, RuntimeError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted; labs removed", code=130)
    env = doc["environment"]
    env["loadavg_at_end"] = os.getloadavg()
    env["contended"] = busy([env["machine_at_start"], env["machine_at_end"]])
    doc["quick"] = quick
    publish("ovn-compare", doc, out, ovncompare, as_json, plot=None if replicas > 1 else "ovn-compare.png")

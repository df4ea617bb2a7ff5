"""`fathom cluster status`: the controller replicas sharing the store, their switch leases and epochs."""
from __future__ import annotations

import click

from fathom.cli.output import print_json, print_table, terminal_safe
from fathom.cli.resources import api_command


@click.group()
def cluster():
    """Controller replicas on one PostgreSQL store and the switches each is master of."""


@api_command(cluster, "status")
def status(api, as_json):
    """Replicas (live, last renewal, switches held) and every switch's lease (master, epoch, expiry)."""
    out = api.call("GET", "/cluster")
    if as_json:
        return print_json(out)
    t = out["timing"]
    if out["store"] != "postgresql":
        return click.echo(terminal_safe(f"no cluster: the store is {out['store']} (one controller; a cluster needs "
                                        f"PostgreSQL)"))
    click.echo(f"lease {t['lease']} s, renewed every {t['renew']} s (PostgreSQL's clock); notification queue "
               f"{out['notify_queue_usage']:.1%} used")
    print_table("replicas", ["id", "address", "OpenFlow", "live", "last renewal (s ago)", "switches", "feed lag (s)",
                             "schema", "PKI"],
                [[r["id"], r["address"], r["openflow"], "yes" if r["live"] else "no", r["heartbeat_age"], r["switches"],
                  "-" if r["feed_lag"] is None else r["feed_lag"], r["schema_version"], r["pki_fingerprint"][:16]]
                 for r in out["replicas"]])
    print_table("leases", ["switch", "master", "epoch", "expires in (s)", "renewed (s ago)"],
                [[x["switch"], x["holder"] or "-", x["epoch"], "-" if x["expires_in"] is None else x["expires_in"],
                  "-" if x["renewed_age"] is None else x["renewed_age"]] for x in out["leases"]])

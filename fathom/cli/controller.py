"""`fathom controller`: run the controller; `fathom flows NODE`: desired and actual flows."""
import click

from fathom.cli.output import console, fail, print_json
from fathom.cli.resources import DEFAULT_CONTROLLER, Api


@click.command()
@click.option("--db", "db_url", default="sqlite:///fathom.db", show_default=True, envvar="FATHOM_DB",
              help="Store URL: a SQLite file, or postgresql+psycopg://user@host/db.")
@click.option("--api-host", "api_hosts", multiple=True, default=["127.0.0.1"], show_default=True,
              help="Address the REST API listens on (repeatable; the agents on the nodes must reach one).")
@click.option("--api-port", default=8080, show_default=True, type=int)
@click.option("--of-host", default="0.0.0.0", show_default=True, help="Address switches connect to.")
@click.option("--of-port", default=6653, show_default=True, type=int)
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds between cheap drift checks (each switch's flow and group counts, each node's OVSDB "
                   "replica); passes themselves run on events only.")
@click.option("--audit-interval", default=None, type=click.FloatRange(1.0),
              help="Seconds between audits, each reading switches back in turn, 20,000 flows a time "
                   "(default: 60 checks, at least 300).")
@click.option("--pki-dir", default="/etc/fathom/pki", show_default=True, envvar="FATHOM_PKI_DIR",
              help="The fathom PKI (fathom pki init) whose controller certificate secures OpenFlow and OVSDB.")
@click.option("--insecure", is_flag=True,
              help="OpenFlow and OVSDB over plain TCP, unauthenticated and unencrypted (not for production).")
@click.option("--state-dir", default="/var/lib/fathom", show_default=True, envvar="FATHOM_STATE_DIR",
              help="Where the controller keeps its admin credential (admin-token, mode 0600).")
@click.option("--max-body", default=1 << 20, show_default=True, type=click.IntRange(1024),
              envvar="FATHOM_API_MAX_BODY", help="Largest request body the API reads, in bytes.")
@click.option("--datapath-settle", default=0.02, show_default=True, type=click.FloatRange(0.0, 1.0),
              envvar="FATHOM_DATAPATH_SETTLE",
              help="Seconds a pass that changes several switches waits, once the new state is in, before it "
                   "takes the old away: OVS's datapath forwards by the flows it cached until its revalidators "
                   "catch up. Raise it where `ovs-appctl upcall/show` reports long dump durations; 0: no wait.")
@click.option("--cluster", is_flag=True,
              help="Run as one replica of a cluster of controllers sharing this PostgreSQL store: each switch "
                   "has one master replica, held as a lease in the store (docs/ha.md).")
@click.option("--advertise", default=None, metavar="HOST",
              help="With --cluster: the address switches reach this replica's OpenFlow listener at (default: "
                   "--of-host; with a wildcard --of-host, the address the master of a node reaches it from, "
                   "which holds for replicas on one host).")
@click.option("--api-workers", default=1, show_default=True, type=click.IntRange(1, 64), envvar="FATHOM_API_WORKERS",
              help="Processes serving the REST API on the same address (PostgreSQL only); one of them runs "
                   "the reconciler and OpenFlow (docs/ha.md).")
def controller(db_url, api_hosts, api_port, of_host, of_port, interval, audit_interval, pki_dir, insecure,
               state_dir, max_body, datapath_settle, cluster, advertise, api_workers):
    """Run the controller: REST API, OpenFlow controller, node bootstrap and reconciler.

    At its first start it writes an admin token to STATE_DIR/admin-token (readable by root only);
    use it with FATHOM_TOKEN_FILE=STATE_DIR/admin-token, and issue others with `fathom token create`."""
    from fathom.controller.workers import refuse_sqlite
    if (why := refuse_sqlite(db_url, api_workers)) is not None:
        fail(why, 2)
    from fathom.controller.server import serve
    from fathom.pki import CONTROLLER_NAME, Pki, PkiError
    if not insecure:
        try:
            Pki(pki_dir).verify(CONTROLLER_NAME)
        except (PkiError, OSError) as e:
            fail(f"TLS needs the controller certificate of a fathom PKI: {e}. Create one with "
                 f"'fathom pki init --dir {pki_dir}', or run with --insecure for plain TCP.", 2)
    from fathom.cluster.leases import ClusterError
    try:
        serve(db_url, list(api_hosts), api_port, of_host, of_port, interval, pki_dir=None if insecure else pki_dir,
              state_dir=state_dir, max_body=max_body, audit_interval=audit_interval, datapath_settle=datapath_settle,
              cluster=cluster, advertise=advertise, api_workers=api_workers)
    except ClusterError as e:
        fail(str(e), 2)


@click.command()
@click.argument("node")
@click.option("--controller", envvar="FATHOM_CONTROLLER", default=DEFAULT_CONTROLLER, show_default=True,
              help="URL of the fathom controller (env FATHOM_CONTROLLER).")
@click.option("--json", "as_json", is_flag=True)
def flows(node, controller, as_json):
    """Desired and actual flows of NODE's br-int, per pipeline stage, in ovs-ofctl syntax."""
    data = Api(controller).call("GET", f"/nodes/{node}/flows")
    if as_json:
        return print_json(data)
    console.print(f"node [bold]{node}[/bold]: {'connected' if data['connected'] else '[red]not connected'}"
                  f", {'in sync' if data['in_sync'] else '[yellow]NOT in sync'}", highlight=False)
    for title, key, gkey in (("desired", "desired", "desired_groups"), ("actual", "actual", "actual_groups")):
        console.rule(title)
        if data[key] is None:
            console.print("  (switch not connected)")
            continue
        for g in data[gkey] or []:
            console.print(f"  {g}", highlight=False, soft_wrap=True)
        for stage, lines in data[key].items():
            console.print(f"[bold]{stage}[/bold]")
            for line in lines:
                console.print(f"  {line}", highlight=False, soft_wrap=True)

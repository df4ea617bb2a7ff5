"""`fathom pki`: the CAs and certificates that secure OpenFlow and OVSDB (see docs/security.md)."""
import click

from fathom.cli.output import console, fail, print_json, print_table
from fathom.pki import KINDS, LEAF_DAYS, Pki, PkiError

DIR = click.option("--dir", "directory", default="/etc/fathom/pki", show_default=True, envvar="FATHOM_PKI_DIR",
                   help="The PKI directory (root-only).")


def _dpid(value: str) -> int:
    try:
        return int(value.removeprefix("0x"), 16)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a datapath id (hex)") from None


@click.group()
def pki():
    """Certificates for the control channels: a controller CA, a switch CA, one certificate per node."""


@pki.command()
@DIR
@click.option("--json", "as_json", is_flag=True)
def init(directory, as_json):
    """Create both CAs and the controller's certificate (nothing is changed if they exist)."""
    try:
        created = Pki(directory).init()
    except (PkiError, OSError) as e:
        fail(str(e))
    if as_json:
        return print_json({"dir": directory, "created": created})
    console.print(f"PKI in {directory}: {'created' if created else 'already there, unchanged'}", highlight=False)


@pki.command()
@DIR
@click.argument("name")
@click.option("--kind", type=click.Choice([k for k in KINDS if k != "controller"]), default="node", show_default=True,
              help="node (a compute or gateway node) or switch (a fabric switch)")
@click.option("--dpid", "dpids", multiple=True, metavar="HEX",
              help="A datapath id this certificate may claim (repeatable); without any, the controller's "
                   "registry alone decides.")
@click.option("--days", default=LEAF_DAYS, show_default=True, type=click.IntRange(1, 3650))
@click.option("--json", "as_json", is_flag=True)
def issue(directory, name, kind, dpids, days, as_json):
    """Issue a key and certificate for NAME (a node or fabric switch, as registered)."""
    try:
        files = Pki(directory).issue(name, kind, [_dpid(d) for d in dpids], days)
    except (PkiError, OSError) as e:
        fail(str(e))
    out = {"name": name, "key": str(files.key), "cert": str(files.cert), "ca_cert": str(files.trust)}
    if as_json:
        return print_json(out)
    console.print(f"{kind} {name}: key {files.key}, certificate {files.cert}; it trusts {files.trust}\n"
                  f"on the node: ovs-vsctl set-ssl <key> <certificate> <ca_cert> and "
                  f"set-manager pssl:6640:<management ip>", highlight=False)


@pki.command("list")
@DIR
@click.option("--json", "as_json", is_flag=True)
def list_(directory, as_json):
    """Every certificate the PKI issued: holder, kind, issuer, expiry, bound datapath ids."""
    try:
        certs = Pki(directory).list()
    except (PkiError, OSError) as e:
        fail(str(e))
    if as_json:
        return print_json(certs)
    print_table(None, ["name", "kind", "issuer", "not after", "datapath ids", "serial"],
                [[c["name"], c["kind"], c["issuer"], c["not_after"], " ".join(c["dpids"]) or "-", c["serial"]]
                 for c in certs])


@pki.command()
@DIR
@click.argument("names", nargs=-1)
@click.option("--ca", type=click.Choice(["controller", "switch"]),
              help="Rotate a CA instead: a new CA, trusted next to the old one, re-issues all its certificates.")
@click.option("--finish", is_flag=True, help="With --ca: stop trusting the previous CA.")
@click.option("--days", default=LEAF_DAYS, show_default=True, type=click.IntRange(1, 3650))
@click.option("--json", "as_json", is_flag=True)
def rotate(directory, names, ca, finish, days, as_json):
    """New keys and certificates for NAMES (same subject and datapath ids), or a CA rotation."""
    p = Pki(directory)
    try:
        if ca and names:
            fail("give NAMES or --ca, not both", 2)
        if finish and not ca:
            fail("--finish goes with --ca", 2)
        if ca and finish:
            p.finish_ca_rotation(ca)
            rotated = []
        elif ca:
            rotated = p.rotate_ca(ca)
        elif names:
            rotated = [n for n in names if p.rotate(n, days)]
        else:
            fail("nothing to rotate: give NAMES or --ca", 2)
    except (PkiError, OSError) as e:
        fail(str(e))
    if as_json:
        return print_json({"rotated": rotated, "ca": ca, "finished": finish})
    if ca and finish:
        console.print(f"{ca} CA: the previous CA is no longer trusted; distribute {p.ca_dir(ca) / 'trust.pem'}",
                      highlight=False)
    else:
        console.print(f"re-issued: {' '.join(rotated) or '-'}; install them (docs/security.md, key rotation)",
                      highlight=False)

"""`fathom lab`: bring an emulated cloud up, inspect it, run commands in it, take it down."""
import os
import sys

import click

from fathom.cli.output import console, err_console, fail, print_json, print_table
from fathom.cli.renamed import renamed
from fathom.lab.lab import Lab, list_labs
from fathom.lab.sh import LabError
from fathom.lab.topology import DEFAULT_TOPOLOGY, TopologyError, load

NAME = click.option("--name", "-n", default="fathom", show_default=True, envvar="FATHOM_LAB",
                    help="Lab name: prefix of every namespace and link (1-8 chars a-z0-9).")


def _lab(name: str) -> Lab:
    try:
        return Lab(name)
    except ValueError as e:
        fail(str(e), 2)


@click.group()
def lab():
    """The emulated cloud: nodes and VMs as namespaces, a real OVS per node."""


@lab.command()
@NAME
@click.option("--topology", "-t", type=click.Path(dir_okay=False), default=str(DEFAULT_TOPOLOGY),
              show_default="the shipped default: 2 compute nodes + gateway, 2 VMs each")
@click.option("--standalone", is_flag=True, help="No controller: bridges switch in NORMAL mode.")
@click.option("--controller", "-c", metavar="URL",
              help="Register the lab with the controller at URL (default: start one for the lab).")
@click.option("--insecure", is_flag=True, help="OpenFlow and OVSDB over plain TCP instead of TLS.")
@click.option("--pki-dir", type=click.Path(file_okay=False),
              help="With --controller: that controller's PKI (fathom pki init), to issue node certificates.")
@click.option("--agent-controller", metavar="URL",
              help="With --controller: its API as the nodes' agents reach it from their namespaces (default: "
                   "URL, with a loopback host replaced by the lab's management bridge address).")
@click.option("--db", metavar="URL", help="The lab's own controller's store (default: a SQLite file in the lab's run "
              "dir); postgresql+psycopg://... for PostgreSQL.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1, 9),
              help="Start this many controller replicas (fathom controller --cluster) on the PostgreSQL store --db.")
@click.option("--json", "as_json", is_flag=True, help="Print the lab's state as JSON.")
def up(name, topology, standalone, controller, insecure, pki_dir, agent_controller, db, replicas, as_json):
    """Build a lab from a topology file."""
    lab_ = _lab(name)
    try:
        topo = load(topology)
    except TopologyError as e:
        for line in e.lines():
            err_console.print(f"[red]error:[/red] {line}", highlight=False)
        sys.exit(2)
    try:
        with console.status(f"lab {name}: starting") as status:
            state = lab_.up(topo, os.path.abspath(topology), standalone=standalone, controller=controller,
                            progress=lambda s: status.update(f"lab {name}: {s}"), insecure=insecure,
                            pki_dir=os.path.abspath(pki_dir) if pki_dir else None, agent_url=agent_controller,
                            db=db, replicas=replicas)
    except LabError as e:
        fail(str(e))
    if as_json:
        print_json(state)
    else:
        console.print(f"lab [bold]{name}[/bold] is up: {len(state['nodes'])} nodes, "
                      f"{sum(len(n.vms) for n in topo.nodes)} VMs, {len(topo.vnfs())} VNFs"
                      f"{' (standalone)' if standalone else ''}. See 'fathom lab status -n {name}'.")
        if state.get("controller"):
            ctl = state["controller"]
            console.print(f"controller: {ctl['url']} (export FATHOM_CONTROLLER={ctl['url']})")
            for replica in ctl.get("replicas", [])[1:]:
                console.print(f"replica: {replica['url']}")
            if ctl.get("token_file"):
                console.print(f"admin token: {ctl['token_file']} (export FATHOM_TOKEN_FILE={ctl['token_file']})",
                              highlight=False, soft_wrap=True)


@lab.command()
@NAME
@click.option("--json", "as_json", is_flag=True)
def down(name, as_json):
    """Remove every namespace, link, process and run dir of a lab (also a crashed or half-built one)."""
    try:
        removed = _lab(name).down()
    except LabError as e:
        fail(str(e))
    if as_json:
        print_json({"name": name, "removed": removed})
    else:
        console.print(f"lab {name}: removed {len(removed)} objects" if removed else f"lab {name}: nothing to remove")


@lab.command()
@NAME
@click.option("--json", "as_json", is_flag=True)
def status(name, as_json):
    """Nodes (OVS version, processes), bridges, ports and VMs of a lab."""
    try:
        st = _lab(name).status()
    except LabError as e:
        fail(str(e))
    if as_json:
        return print_json(st)
    console.print(f"lab [bold]{name}[/bold]: {st['status']}{' (standalone)' if st['standalone'] else ''}"
                  f" — management {st['management']['cidr']}, underlay {st['underlay']['cidr']}"
                  + (f", controller {st['controller']['url']}" if st.get("controller") else ""))
    yes = lambda b: "yes" if b else "[red]NO[/red]"

    def daemon(n, key, name):   # alive, and how often its supervisor restarted it
        sup = (n.get("supervisor") or {}).get("daemons", {}).get(name) or {}
        restarts = sup.get("restarts") or 0
        return yes(n[key]) + (f" ({restarts} restart{'s' if restarts != 1 else ''})" if restarts else "")

    def supervisor(n):
        sup = n.get("supervisor")
        return "-" if sup is None else yes(sup["running"])
    print_table("nodes", ["node", "role", "mgmt ip", "tunnel ip", "ovs", "ovsdb-server", "ovs-vswitchd", "supervisor",
                          "bridges: ports"],
                [[n["name"], n["role"], n["mgmt_ip"], n["tunnel_ip"], n["ovs_version"] or "-",
                  daemon(n, "ovsdb_server", "ovsdb-server"), daemon(n, "ovs_vswitchd", "ovs-vswitchd"), supervisor(n),
                  "; ".join(f"{b}: {' '.join(p) or '-'}" for b, p in n["bridges"].items())] for n in st["nodes"]])
    print_table("vms", ["vm", "node", "network", "mac", "ip", "link"],
                [[v["name"], v["node"], v["network"], v["mac"], v["ip"], "up" if v["link_up"] else "[red]down[/red]"]
                 for v in st["vms"]])
    if st.get("vnfs"):
        print_table("vnfs", ["vnf", "kind", "node", "network", "ingress (eth0)", "egress (eth1)", "netns"],
                    [[v["name"], v["kind"], v["node"], v["network"], f"{v['ingress']['ip']} {v['ingress']['mac']}",
                      f"{v['egress']['ip']} {v['egress']['mac']}", "yes" if v["present"] else "[red]NO[/red]"]
                     for v in st["vnfs"]])


@lab.command("list")
@click.option("--json", "as_json", is_flag=True)
def list_(as_json):
    """Labs on this machine."""
    labs = list_labs()
    if as_json:
        return print_json(labs)
    if not labs:
        return console.print("no labs")
    print_table(None, ["lab", "status", "nodes", "vms", "standalone", "topology"],
                [[l["name"], l["status"], l["nodes"], l["vms"], l["standalone"], l["topology_file"]] for l in labs])


@lab.command()
@NAME
@click.option("--neutron-port", required=True, metavar="UUID", help="The Neutron port the VM is plugged for.")
@click.option("--os-vif", "os_vif", is_flag=True,
              help="Plug as os-vif does (needs --node and --mac-address; fathom need not hold the port yet) and take "
                   "the address by DHCP; without it, fathom's port gives the node, MAC and a static address.")
@click.option("--node", help="With --os-vif: the node the port is bound to (binding:host_id).")
@renamed("--mac", "mac_address")
@click.option("--mac-address", help="With --os-vif: the port's MAC (mac_address).")
@click.option("--no-dhcp", is_flag=True, help="With --os-vif: leave eth0 without an address.")
@click.option("--vm", help="The VM's name (default vm-<first 8 characters of the UUID>).")
@click.option("--json", "as_json", is_flag=True)
def plug(name, neutron_port, os_vif, node, mac_address, no_dhcp, vm, as_json):
    """Plug a VM for a Neutron port into the node it is bound to, as Nova and os-vif would."""
    from fathom.lab.plug import plug_neutron_port, plug_os_vif
    if os_vif and not (node and mac_address):
        fail("--os-vif needs --node and --mac-address (the port's binding:host_id and mac_address)")
    try:
        done = (plug_os_vif(_lab(name), neutron_port, node, mac_address, vm, dhcp=not no_dhcp) if os_vif
                else plug_neutron_port(_lab(name), neutron_port, vm))
    except LabError as e:
        fail(str(e))
    if as_json:
        return print_json(done)
    console.print(f"VM [bold]{done['vm']}[/bold] on {done['node']}: {done['interface']} {done['mac']} "
                  f"{done['ip'] or '(no address)'}" + (f" (fathom port {done['port_id']})" if "port_id" in done else ""))


@lab.command()
@NAME
@click.option("--node", default="gw", show_default=True, help="The gateway node the upstream host is wired to.")
@click.option("--host", "host", default="up", show_default=True, help="The upstream host's name (namespace <lab>-<host>).")
@renamed("--mac", "mac_address")
@click.option("--mac-address", help="Its MAC (needed): the [fathom] upstream_mac Neutron's driver is given.")
@click.option("--address", required=True, metavar="CIDR",
              help="Its address: the external subnet's gateway_ip with the prefix length, e.g. 203.0.113.1/24.")
@click.option("--vlan", type=int, default=None, help="The external network's VLAN (none: a flat network).")
def upstream(name, node, host, mac_address, address, vlan):
    """Wire an upstream host (the provider router of an external network made by a cloud, e.g.
    Neutron) to a gateway node: `fathom lab exec <host> ping <floating IP>` then reaches the VMs."""
    if not mac_address:   # not required=True in click: --mac, its old spelling, may give it instead
        raise click.UsageError("Missing option '--mac-address'.")
    lab_ = _lab(name)
    try:
        lab_.wire_upstream(lab_.node(node), host, mac_address, address, vlan)
    except LabError as e:
        fail(str(e))
    console.print(f"upstream host {host} ({address}, {mac_address}) wired to {node}"
                  + (f" on VLAN {vlan}" if vlan else ""))


@lab.group()
def controller():
    """The lab's own controller (started by `fathom lab up` without --controller)."""


@controller.command("restart")
@NAME
@click.option("--downtime", type=float, default=0.0, show_default=True, help="Seconds to stay down in between.")
def controller_restart(name, downtime):
    """Stop the lab's controller (if running) and start it again: same ports, store and PKI."""
    lab_ = _lab(name)
    try:
        lab_.restart_controller(downtime)
    except LabError as e:
        fail(str(e))
    console.print(f"lab {name}: controller restarted ({lab_.state()['controller']['url']})")


@controller.command("stop")
@NAME
def controller_stop(name):
    """Stop the lab's controller (the switches keep their flows; `restart` brings it back)."""
    from fathom.lab.controller import stop_controller
    lab_ = _lab(name)
    if not (lab_.state().get("controller") or {}).get("managed"):
        fail(f"lab {name} does not run its own controller")
    stop_controller(lab_.dir)
    console.print(f"lab {name}: controller stopped")


@lab.command()
@NAME
@click.argument("vm")
@click.option("--json", "as_json", is_flag=True)
def unplug(name, vm, as_json):
    """Remove a VM made by `fathom lab plug`."""
    from fathom.lab.plug import unplug as unplug_vm
    try:
        done = unplug_vm(_lab(name), vm)
    except LabError as e:
        fail(str(e))
    if as_json:
        return print_json(done)
    console.print(f"VM {done['vm']} removed from {done['node']}")


@lab.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@NAME
@click.argument("target")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def exec(name, target, cmd):
    """Run CMD in a node or VM namespace, e.g. `fathom lab exec vm1 ping 198.19.1.13`.

    In a node, the OVS tools (ovs-vsctl, ovs-ofctl, ovs-appctl) talk to that node's OVS.
    """
    try:
        argv, env = _lab(name).exec_args(target, list(cmd))
    except LabError as e:
        fail(str(e))
    os.execvpe(argv[0], argv, env)

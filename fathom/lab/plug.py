"""Plug a VM into a lab node for a port that a cloud (Neutron) made.

`plug_os_vif` does what Nova and os-vif's ovs plugin do on a compute node and nothing else: a tap
device `tap<uuid[:11]>` on br-int with the external_ids os-vif sets, for a port fathom need not hold
yet; the VM takes its address by DHCP, as a cloud image does. `plug_neutron_port` is the quicker
path for a port fathom already holds: the port's address is put on the VM's eth0 directly.

Either way the VM is a namespace `<lab>-<vm>` whose eth0 has the port's MAC; the node end of the
veth, `tap<uuid[:11]>`, is added to the node's br-int with the external_ids os-vif sets (iface-id =
the Neutron port UUID, attached-mac, iface-status). fathom's controller then sees the interface on
br-int and installs the port's flows; the port turns active.
"""
from __future__ import annotations

import ipaddress
import re
import time

from fathom.client import ApiError, Client

from .lab import Lab, _add_netns, _prepare_veth_end
from .ovs import OvsInstance
from .sh import LabError, run

VM_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")


def plug_neutron_port(lab: Lab, neutron_port: str, vm: str | None = None) -> dict:
    """Create the VM of the fathom port whose external_id is `neutron_port`; returns what was made."""
    state = lab.state()
    if not state.get("controller"):
        raise LabError(f"lab {lab.name} has no controller")
    api = Client.for_lab(state)
    try:
        found = api.list("/ports", params={"external_id": neutron_port})
        if not found:
            raise LabError(f"fathom holds no port for Neutron port {neutron_port} (yet)")
        port = found[0]
        if not port["node"] or not port["interface_name"]:
            raise LabError(f"port {port['id']} is not bound (Neutron binding:host_id names the node)")
        if not port["fixed_ips"]:
            raise LabError(f"port {port['id']} has no IPv4 address")
        subnet = api.get(f"/subnets/{port['fixed_ips'][0]['subnet_id']}")
    except ApiError as e:
        raise LabError(f"controller: {e}") from None
    finally:
        api.close()
    prefix = ipaddress.IPv4Network(subnet["cidr"]).prefixlen
    address = port["fixed_ips"][0]["ip_address"]
    return _plug(lab, lab.node(port["node"]), vm or "vm-" + neutron_port[:8], port["interface_name"], neutron_port,
                 port["mac_address"], f"{address}/{prefix}", subnet["gateway_ip"], port_id=port["id"])


def plug_os_vif(lab: Lab, neutron_port: str, node: str, mac: str, vm: str | None = None,
                dhcp: bool = True, timeout: float = 30) -> dict:
    """As os-vif's ovs plugin (vif_type ovs) with the hypervisor's tap: the VM `<lab>-<vm>` on
    `node`, its eth0 with `mac` and no address; the node end `tap<uuid[:11]>` a port of br-int with
    external_ids iface-id (the Neutron port), attached-mac and iface-status=active. Then, with
    `dhcp`, one DHCP exchange in the VM (udhcpc, `Lab.dhcp_vm`), retried until `timeout`: the port's
    flows (and its node's DHCP server) follow the plug."""
    if not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", mac.lower()):
        raise LabError(f"MAC {mac!r}: six hex bytes separated by ':'")
    vm = vm or "vm-" + neutron_port[:8]
    plugged = _plug(lab, lab.node(node), vm, ("tap" + neutron_port)[:14], neutron_port, mac.lower())
    if dhcp:
        deadline = time.monotonic() + timeout
        while True:
            try:
                plugged["lease"] = lab.dhcp_vm(vm)
                break
            except LabError:
                if time.monotonic() > deadline:
                    raise
        plugged["ip"] = plugged["lease"]["ip"]
    return plugged


def _plug(lab: Lab, node, vm: str, ifname: str, neutron_port: str, mac: str, address: str | None = None,
          gateway: str | None = None, **extra) -> dict:
    """The VM namespace `<lab>-<vm>` with eth0 at `mac` (and `address`, a default route via `gateway`
    when given), the veth's node end `ifname` a port of the node's br-int with os-vif's external_ids;
    recorded in the lab's state (`unplug`, `lab down`)."""
    if not VM_NAME_RE.match(vm):
        raise LabError(f"VM name {vm!r}: 1-31 of a-z, 0-9, '-'")
    vns = lab.ns(vm)
    if vns in lab.namespaces():
        raise LabError(f"lab {lab.name} already has a VM or node named {vm!r}")
    _add_netns(vns)
    run(["ip", "link", "add", ifname, "netns", node.netns, "type", "veth", "peer", "name", "eth0", "netns", vns])
    run(["ip", "link", "set", "eth0", "address", mac], ns=vns)
    _prepare_veth_end(vns, "eth0")
    if address:
        run(["ip", "addr", "add", address, "dev", "eth0"], ns=vns)
    if gateway:
        run(["ip", "route", "add", "default", "via", gateway], ns=vns)
    _prepare_veth_end(node.netns, ifname)
    OvsInstance(node.netns, node.rundir).vsctl(
        "--may-exist", "add-port", "br-int", ifname, "--", "set", "interface", ifname,
        f"external_ids:iface-id={neutron_port}", f"external_ids:attached-mac={mac}",
        "external_ids:iface-status=active")
    plugged = {"vm": vm, "node": node.name, "interface": ifname, "neutron_port": neutron_port, "mac": mac,
               "ip": address.split("/")[0] if address else None, **extra}
    state = lab.state()
    state.setdefault("plugged", []).append(plugged)
    lab._save(state)
    return plugged


def unplug(lab: Lab, vm: str) -> dict:
    """Remove a plugged VM: its namespace, and its interface from the node's br-int."""
    state = lab.state()
    entry = next((p for p in state.get("plugged", []) if p["vm"] == vm), None)
    if entry is None:
        raise LabError(f"lab {lab.name} has no plugged VM {vm!r}")
    node = lab.node(entry["node"])
    OvsInstance(node.netns, node.rundir).vsctl("--if-exists", "del-port", "br-int", entry["interface"])
    run(["ip", "netns", "del", lab.ns(vm)], check=False)
    state["plugged"] = [p for p in state["plugged"] if p["vm"] != vm]
    lab._save(state)
    return entry

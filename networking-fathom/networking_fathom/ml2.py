"""ML2 mechanism driver `fathom`: networks, subnets, ports and port binding.

Precommit hooks write a journal entry in Neutron's transaction (networking_fathom.db); postcommit
hooks only wake the journal thread, which replays to fathom. Nothing here waits for fathom, so
Neutron answers whether or not fathom is reachable, and nothing committed is lost.

Binding: fathom's datapath is OVS, so a port on a vxlan, vlan or flat segment is bound with
vif_type `ovs` to br-int (what Nova/os-vif plug); fathom's replacement of the OVS agent is the
controller itself, there is no agent to ask. A bound port gets a provisioning block, completed
when fathom reports the port active (networking_fathom.journal), as ML2/OVN does with ovn-installed.
"""
from __future__ import annotations

from neutron_lib import constants as n_const
from neutron_lib.api.definitions import portbindings
from neutron_lib.callbacks import resources as cb_resources
from neutron_lib.plugins.ml2 import api
from oslo_log import log as logging

from neutron.db import provisioning_blocks

from . import config  # noqa: F401  (registers the [fathom] options)
from . import db
from .journal import Journal
from .resources.network import TYPES
from .resources.port import bound_host

LOG = logging.getLogger(__name__)

VIF_DETAILS = {portbindings.CAP_PORT_FILTER: True, portbindings.OVS_HYBRID_PLUG: False,
               portbindings.VIF_DETAILS_BRIDGE_NAME: "br-int",
               portbindings.VIF_DETAILS_CONNECTIVITY: portbindings.CONNECTIVITY_L2}


def network_data(context) -> dict:
    net = dict(context.current)
    segments = context.network_segments or []
    if len(segments) == 1 and not net.get("provider:network_type"):
        net["provider:network_type"] = segments[0][api.NETWORK_TYPE]
        net["provider:segmentation_id"] = segments[0][api.SEGMENTATION_ID]
        net["provider:physical_network"] = segments[0][api.PHYSICAL_NETWORK]
    return net


def port_data(context) -> dict:
    port = dict(context.current)
    port[portbindings.HOST_ID] = context.host
    port[portbindings.VIF_TYPE] = context.vif_type
    return port


class FathomMechanismDriver(api.MechanismDriver):

    def initialize(self):
        self.journal = Journal.get()
        self.journal.start()

    @property
    def connectivity(self):
        return portbindings.CONNECTIVITY_L2

    # ---- networks
    def create_network_precommit(self, context):
        db.record(context._plugin_context, "network", "set", network_data(context))

    def update_network_precommit(self, context):
        db.record(context._plugin_context, "network", "set", network_data(context))

    def delete_network_precommit(self, context):
        db.record(context._plugin_context, "network", "delete", _ident(context.current))

    # ---- subnets
    def create_subnet_precommit(self, context):
        db.record(context._plugin_context, "subnet", "set", dict(context.current))

    def update_subnet_precommit(self, context):
        db.record(context._plugin_context, "subnet", "set", dict(context.current))

    def delete_subnet_precommit(self, context):
        db.record(context._plugin_context, "subnet", "delete", _ident(context.current))

    # ---- ports
    def create_port_precommit(self, context):
        db.record(context._plugin_context, "port", "set", port_data(context))

    def update_port_precommit(self, context):
        data = port_data(context)
        db.record(context._plugin_context, "port", "set", data)
        newly_bound = bound_host(data) and (context.original_host != context.host or
                                            context.original_vif_type != context.vif_type)
        if newly_bound and not (data.get("device_owner") or "").startswith("network:"):
            # ACTIVE only once fathom says the VIF is plugged and its flows are on the switch
            provisioning_blocks.add_provisioning_component(
                context._plugin_context, data["id"], cb_resources.PORT, provisioning_blocks.L2_AGENT_ENTITY)

    def delete_port_precommit(self, context):
        db.record(context._plugin_context, "port", "delete", _ident(context.current))

    # ---- postcommit: the journal thread does the work
    def _wake(self, context):
        self.journal.wake()

    create_network_postcommit = update_network_postcommit = delete_network_postcommit = _wake
    create_subnet_postcommit = update_subnet_postcommit = delete_subnet_postcommit = _wake
    create_port_postcommit = update_port_postcommit = delete_port_postcommit = _wake

    # ---- binding
    def bind_port(self, context):
        for segment in context.segments_to_bind:
            if segment[api.NETWORK_TYPE] in TYPES:
                context.set_binding(segment[api.ID], portbindings.VIF_TYPE_OVS, VIF_DETAILS,
                                    status=n_const.PORT_STATUS_DOWN)
                return
        LOG.debug("fathom: no vxlan/vlan/flat segment to bind port %s", context.current["id"])


def _ident(obj: dict) -> dict:
    return {"id": obj["id"], "project_id": obj.get("project_id") or obj.get("tenant_id")}

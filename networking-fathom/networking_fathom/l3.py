"""L3 service providers, one per fathom router mode, for Neutron's stock `router` service plugin and
its flavors (as networking-odl's L3 flavor driver):

    [service_providers]
    service_provider = L3_ROUTER_NAT:fathom:networking_fathom.l3.Distributed:default
    service_provider = L3_ROUTER_NAT:fathom_fabric:networking_fathom.l3.Fabric
    service_provider = L3_ROUTER_NAT:fathom_network_node:networking_fathom.l3.NetworkNode

A router made without a flavor goes to the default provider; a flavor whose service profile names
one of these drivers gives its mode (docs/openstack.md shows the three `openstack network flavor`
commands). Router interfaces are ports and go through the ML2 driver's journal.

A router's journal entry holds its external gateway too (network, the addresses Neutron allocated,
SNAT). Neutron sets a gateway in a transaction of its own before the router's update (or after its
creation): the gateway's callbacks record the router again, once the gateway is committed. Floating
IPs are journaled by `FloatingIpCallbacks` (subscribed once, whichever provider loads first).
"""
from __future__ import annotations

from neutron_lib.callbacks import events, priority_group, registry, resources
from neutron_lib.db import api as db_api
from neutron_lib.plugins import constants as plugin_constants
from neutron_lib.plugins import directory
from oslo_log import log as logging

from neutron.objects import router as l3_obj
from neutron.services.l3_router.service_providers import base

from . import config  # noqa: F401
from . import db
from .journal import Journal
from .resources.floating_ip import fip_data


def gateway_info(router_db) -> dict | None:
    """Neutron's external_gateway_info of a router row."""
    gw = router_db.gw_port
    if gw is None:
        return None
    return {"network_id": gw["network_id"], "enable_snat": bool(router_db.enable_snat),
            "external_fixed_ips": [{"subnet_id": ip["subnet_id"], "ip_address": str(ip["ip_address"])}
                                   for ip in gw["fixed_ips"]]}

LOG = logging.getLogger(__name__)


@registry.has_registry_receivers
class _FathomRouters(base.L3ServiceProvider):
    fathom_mode = ""
    ha_support = base.UNSUPPORTED
    distributed_support = base.OPTIONAL
    use_integrated_agent_scheduler = False    # no L3 agent: fathom's controller routes

    def __init__(self, l3plugin):
        super().__init__(l3plugin)
        self.journal = Journal.get()
        self.journal.start()
        FloatingIpCallbacks.subscribe()

    def _data(self, router_id: str, name: str, project_id: str, gateway: dict | None = None) -> dict:
        return {"id": router_id, "name": name, "project_id": project_id, "fathom_mode": self.fathom_mode,
                "external_gateway_info": gateway}

    @registry.receives(resources.ROUTER_CONTROLLER, [events.PRECOMMIT_ADD_ASSOCIATION])
    def _router_created(self, resource, event, trigger, payload):
        if payload.metadata.get("new_driver") is not self:
            return
        router = payload.states[0]
        db.record(payload.context, "router", "set", self._data(router["id"], router["name"], router["project_id"]))

    @registry.receives(resources.ROUTER, [events.PRECOMMIT_UPDATE], priority_group.PRIORITY_ROUTER_DRIVER)
    def _router_updated(self, resource, event, trigger, payload):
        router_id = payload.resource_id or payload.states[0]["id"]
        if not self.owns_router(payload.context, router_id):
            return
        router_db = payload.desired_state
        db.record(payload.context, "router", "set",
                  self._data(router_id, router_db.name, router_db.project_id, gateway_info(router_db)))

    @registry.receives(resources.ROUTER_GATEWAY, [events.AFTER_CREATE, events.AFTER_DELETE])
    def _gateway_changed(self, resource, event, trigger, payload):
        router_id = payload.resource_id
        if not self.owns_router(payload.context, router_id):
            return
        l3 = directory.get_plugin(plugin_constants.L3)
        ctx = payload.context.elevated()
        with db_api.CONTEXT_WRITER.using(ctx):
            router_db = l3._get_router(ctx, router_id)
            db.record(ctx, "router", "set",
                      self._data(router_id, router_db.name, router_db.project_id, gateway_info(router_db)))
        self.journal.wake()

    @registry.receives(resources.ROUTER_CONTROLLER, [events.PRECOMMIT_DELETE_ASSOCIATIONS])
    def _router_deleted(self, resource, event, trigger, payload):
        if payload.metadata.get("old_driver") is not self:
            return
        router = l3_obj.Router.get_object(payload.context, id=payload.resource_id)
        db.record(payload.context, "router", "delete",
                  {"id": payload.resource_id, "project_id": router.project_id if router else None})

    @registry.receives(resources.ROUTER, [events.AFTER_CREATE, events.AFTER_UPDATE, events.AFTER_DELETE])
    def _router_committed(self, resource, event, trigger, payload):
        self.journal.wake()


class Distributed(_FathomRouters):
    """Routing in every node's br-int, next to the VMs (fathom's default)."""
    fathom_mode = "distributed"


class Fabric(_FathomRouters):
    """Routing in the top-of-rack fabric switch (SVIs), the Multi-Tenant Acceleration paper's scheme."""
    fathom_mode = "fabric"


class NetworkNode(_FathomRouters):
    """Routing on a gateway node, as Neutron's legacy L3 agent does."""
    fathom_mode = "network-node"


class FloatingIpCallbacks:
    """Floating IPs (create, associate, disassociate, move, delete) -> the journal, in Neutron's
    transaction. Whichever router owns the association, fathom finds it as Neutron does."""
    _subscribed = False

    @classmethod
    def subscribe(cls) -> None:
        if cls._subscribed:
            return
        cls._subscribed = True
        registry.subscribe(cls._set, resources.FLOATING_IP, events.PRECOMMIT_CREATE)
        registry.subscribe(cls._set, resources.FLOATING_IP, events.PRECOMMIT_UPDATE)
        registry.subscribe(cls._deleted, resources.FLOATING_IP, events.PRECOMMIT_DELETE)
        for event in (events.AFTER_CREATE, events.AFTER_UPDATE, events.AFTER_DELETE):
            registry.subscribe(cls._wake, resources.FLOATING_IP, event)

    @staticmethod
    def _set(resource, event, trigger, payload):
        db.record(payload.context, "floating_ip", "set", fip_data(payload.desired_state))

    @staticmethod
    def _deleted(resource, event, trigger, payload):
        # published for the deletion of the floating IP's port (the row goes with it by cascade)
        fip_id = payload.latest_state["device_id"]
        fip = l3_obj.FloatingIP.get_object(payload.context.elevated(), id=fip_id)
        db.record(payload.context, "floating_ip", "delete",
                  {"id": fip_id, "project_id": fip.project_id if fip else None})

    @staticmethod
    def _wake(resource, event, trigger, payload):
        Journal.get().wake()

"""L3 service providers, one per fathom router mode, for Neutron's stock `router` service plugin and
its flavors (as networking-odl's L3 flavor driver):

    [service_providers]
    service_provider = L3_ROUTER_NAT:fathom:networking_fathom.l3.Distributed:default
    service_provider = L3_ROUTER_NAT:fathom_fabric:networking_fathom.l3.Fabric
    service_provider = L3_ROUTER_NAT:fathom_network_node:networking_fathom.l3.NetworkNode

A router made without a flavor goes to the default provider; a flavor whose service profile names
one of these drivers gives its mode (docs/openstack.md shows the three `openstack network flavor`
commands). Router interfaces are ports and go through the ML2 driver's journal.
"""
from __future__ import annotations

from neutron_lib.callbacks import events, priority_group, registry, resources
from oslo_log import log as logging

from neutron.objects import router as l3_obj
from neutron.services.l3_router.service_providers import base

from . import config  # noqa: F401
from . import db
from .journal import Journal

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

    def _data(self, router_id: str, name: str, project_id: str) -> dict:
        return {"id": router_id, "name": name, "project_id": project_id, "fathom_mode": self.fathom_mode}

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
        old = payload.states[0]
        name = (payload.request_body or {}).get("name", old["name"])
        db.record(payload.context, "router", "set", self._data(router_id, name, old["project_id"]))

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

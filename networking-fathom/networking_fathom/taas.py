"""TaaS service driver: tap flows -> fathom vTAP policies (networking_fathom.resources.tap_flow).

    [DEFAULT] service_plugins = ...,taas
    [service_providers]
    service_provider = TAAS:fathom:networking_fathom.taas.FathomTaasDriver:default

A tap service is only a port (the monitor) until a flow uses it, so it maps to nothing by itself.
Directions OUT, IN and BOTH map (resources/tap_flow.py). TaaS creates a flow's row before it calls
the driver (there is no validation hook), so a flow fathom cannot hold (a VLAN range) is kept and
marked ERROR, with the reason in the log.
"""
from __future__ import annotations

from neutron_lib import constants as n_const
from neutron_taas.services.taas.service_drivers import TaasBaseDriver
from oslo_log import log as logging

from . import config  # noqa: F401
from . import db
from .journal import Journal
from .resources.tap_flow import supported

LOG = logging.getLogger(__name__)


class FathomTaasDriver(TaasBaseDriver):

    def __init__(self, service_plugin):
        super().__init__(service_plugin)
        self.journal = Journal.get()
        self.journal.start()

    # tap services: nothing of their own in fathom
    def create_tap_service_precommit(self, context):
        pass

    def create_tap_service_postcommit(self, context):
        pass

    def delete_tap_service_precommit(self, context):
        pass

    def delete_tap_service_postcommit(self, context):
        pass

    # tap flows
    def create_tap_flow_precommit(self, context):
        flow = dict(context.tap_flow)
        why = supported(flow)
        if why:
            LOG.error("fathom: tap flow %s is not mapped: %s", flow["id"], why)
            context._plugin.update_tap_flow(context._plugin_context, flow["id"],
                                            {"tap_flow": {"status": n_const.ERROR}})
        service = context._plugin.get_tap_service(context._plugin_context, flow["tap_service_id"])
        db.record(context._plugin_context, "tap_flow", "set", {**flow, "tap_service_port": service["port_id"]})

    def create_tap_flow_postcommit(self, context):
        self.journal.wake()

    def _deleted(self, context):
        flow = context.tap_flow
        db.record(context._plugin_context, "tap_flow", "delete",
                  {"id": flow["id"], "project_id": flow.get("project_id") or flow.get("tenant_id")})
        self.journal.wake()

    # TaaS calls one or the other (precommit for ACTIVE flows, which it leaves to an agent to remove;
    # fathom's flows are never set ACTIVE, so TaaS deletes the row itself and calls postcommit)
    delete_tap_flow_precommit = delete_tap_flow_postcommit = _deleted

    # tap mirrors (GRE/ERSPAN to outside the cloud): not supported
    def create_tap_mirror_precommit(self, context):
        LOG.error("fathom: tap mirrors are not supported; tap mirror %s does nothing", context.tap_mirror["id"])

    def create_tap_mirror_postcommit(self, context):
        pass

    def delete_tap_mirror_precommit(self, context):
        pass

    def delete_tap_mirror_postcommit(self, context):
        pass

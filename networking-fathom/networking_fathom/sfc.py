"""networking-sfc drivers: port pairs, port pair groups and port chains (`FathomSfcDriver`, `[sfc]
drivers = fathom`) and flow classifiers (`FathomFlowClassifierDriver`, `[flowclassifier] drivers =
fathom`) -> fathom's chains (networking_fathom.resources.sfc).

networking-sfc calls each precommit hook inside its transaction: the journal entry is written there,
and a chain fathom cannot hold (correlation `nsh`) or a classifier it cannot (IPv6, L7 parameters,
no logical source port) is refused before Neutron commits it. Postcommit hooks wake the journal.
"""
from __future__ import annotations

from networking_sfc.services.flowclassifier.common import exceptions as fc_exc
from networking_sfc.services.flowclassifier.drivers import base as fc_base
from neutron_lib import exceptions as n_exc
from networking_sfc.services.sfc.drivers import base as sfc_base

from . import config  # noqa: F401
from . import db
from .journal import Journal
from .resources.sfc import unsupported_chain, unsupported_classifier


def _ident(obj: dict) -> dict:
    return {"id": obj["id"], "project_id": obj.get("project_id") or obj.get("tenant_id")}


def _record(context, kind: str, operation: str) -> None:
    obj = dict(context.current)
    db.record(context._plugin_context, kind, operation, obj if operation == "set" else _ident(obj))


def _wake(self, context):
    self.journal.wake()


class FathomSfcDriver(sfc_base.SfcDriverBase):

    def initialize(self):
        self.journal = Journal.get()
        self.journal.start()

    # ---- port chains
    def create_port_chain_precommit(self, context):
        why = unsupported_chain(context.current)
        if why:
            raise n_exc.BadRequest(resource="port_chain", msg=f"fathom: {why}")
        _record(context, "port_chain", "set")

    def update_port_chain_precommit(self, context):
        _record(context, "port_chain", "set")

    def delete_port_chain_precommit(self, context):
        _record(context, "port_chain", "delete")

    # ---- port pairs
    def create_port_pair_precommit(self, context):
        _record(context, "port_pair", "set")

    update_port_pair_precommit = create_port_pair_precommit

    def delete_port_pair_precommit(self, context):
        _record(context, "port_pair", "delete")

    # ---- port pair groups
    def create_port_pair_group_precommit(self, context):
        _record(context, "port_pair_group", "set")

    update_port_pair_group_precommit = create_port_pair_group_precommit

    def delete_port_pair_group_precommit(self, context):
        _record(context, "port_pair_group", "delete")

    # the legacy (non-precommit) hooks and postcommit: the journal thread does the work
    create_port_chain = update_port_chain = delete_port_chain = _wake
    create_port_pair = update_port_pair = delete_port_pair = _wake
    create_port_pair_group = update_port_pair_group = delete_port_pair_group = _wake
    create_port_chain_postcommit = update_port_chain_postcommit = delete_port_chain_postcommit = _wake
    create_port_pair_postcommit = update_port_pair_postcommit = delete_port_pair_postcommit = _wake
    create_port_pair_group_postcommit = update_port_pair_group_postcommit = _wake
    delete_port_pair_group_postcommit = _wake

    # service graphs (chains of chains): not in fathom
    def create_service_graph_precommit(self, context):
        raise n_exc.BadRequest(resource="service_graph", msg="fathom: service graphs are not supported")

    def update_service_graph_precommit(self, context):
        raise n_exc.BadRequest(resource="service_graph", msg="fathom: service graphs are not supported")


class FathomFlowClassifierDriver(fc_base.FlowClassifierDriverBase):

    def initialize(self):
        self.journal = Journal.get()
        self.journal.start()

    def create_flow_classifier_precommit(self, context):
        why = unsupported_classifier(context.current)
        if why:
            raise fc_exc.FlowClassifierBadRequest(message=f"fathom: {why}")
        _record(context, "flow_classifier", "set")

    def update_flow_classifier_precommit(self, context):
        _record(context, "flow_classifier", "set")

    def delete_flow_classifier_precommit(self, context):
        _record(context, "flow_classifier", "delete")

    create_flow_classifier = update_flow_classifier = delete_flow_classifier = _wake
    create_flow_classifier_postcommit = update_flow_classifier_postcommit = _wake
    delete_flow_classifier_postcommit = _wake

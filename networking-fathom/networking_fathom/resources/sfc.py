"""networking-sfc -> fathom's service function chains (docs/sfc.md), one object for one:

- port pair (ingress, egress: a VNF instance's ports) -> port pair;
- port pair group (interchangeable instances) -> port pair group;
- flow classifier (IPv4, protocol, prefixes, port ranges, logical source/destination port) ->
  flow classifier; `l7_parameters` and IPv6 are not fathom's (the classifier stays unmapped);
- port chain (groups in order, classifiers, chain_parameters) -> port chain: `symmetric` as is;
  `correlation` says which chain header VNFs see: fathom steers without one (VNFs see ordinary
  packets), which is what Neutron's default `mpls` comes to for an SFC-unaware VNF; `nsh` is refused.

Members are referenced by fathom id, found by Neutron's UUIDs. A chain's and a group's members
change in place (PATCH); a pair's ports and a classifier's fields cannot change in Neutron either.
"""
from __future__ import annotations

from neutron_lib.plugins import directory

from .base import Mapping


def _plugin(name: str):
    return directory.get_plugin(name)


class PortPair(Mapping):
    kind = "port_pair"
    collection = "sfc/port_pairs"
    order = 7
    immutable = ("ingress", "egress")

    def wanted(self, obj, refs):
        return {"name": (obj.get("name") or "")[:255], "ingress": refs.id("ports", obj["ingress"]),
                "egress": refs.id("ports", obj["egress"]), "external_id": obj["id"]}

    def neutron_objects(self, context):
        sfc = _plugin("sfc")
        return sfc.get_port_pairs(context) if sfc is not None else []


class PortPairGroup(Mapping):
    kind = "port_pair_group"
    collection = "sfc/port_pair_groups"
    order = 8
    mutable = ("name", "port_pairs")

    def wanted(self, obj, refs):
        return {"name": (obj.get("name") or "")[:255],
                "port_pairs": [refs.id("sfc/port_pairs", p) for p in obj.get("port_pairs") or []],
                "external_id": obj["id"]}

    def neutron_objects(self, context):
        sfc = _plugin("sfc")
        return sfc.get_port_pair_groups(context) if sfc is not None else []


CLASSIFIER_FIELDS = ("protocol", "source_ip_prefix", "destination_ip_prefix", "source_port_range_min",
                     "source_port_range_max", "destination_port_range_min", "destination_port_range_max")
PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1}


def unsupported_classifier(obj: dict) -> str | None:
    if (obj.get("ethertype") or "IPv4") != "IPv4":
        return "only IPv4 traffic is classified"
    if obj.get("l7_parameters"):
        return "l7_parameters are not classified"
    if not obj.get("logical_source_port"):
        return "fathom classifies a port's traffic: give logical_source_port"
    return None


class FlowClassifier(Mapping):
    kind = "flow_classifier"
    collection = "sfc/flow_classifiers"
    order = 9
    immutable = CLASSIFIER_FIELDS + ("logical_source_port", "logical_destination_port")

    def wanted(self, obj, refs):
        if unsupported_classifier(obj):
            return None
        protocol = obj.get("protocol")
        body = {k: obj.get(k) for k in CLASSIFIER_FIELDS}
        body["protocol"] = PROTOCOLS.get(str(protocol).lower(), protocol) if protocol is not None else None
        dst = obj.get("logical_destination_port")
        body.update(name=(obj.get("name") or "")[:255], ethertype="IPv4",
                    logical_source_port=refs.id("ports", obj["logical_source_port"]),
                    logical_destination_port=refs.id("ports", dst) if dst else None, external_id=obj["id"])
        return body

    def neutron_objects(self, context):
        fc = _plugin("flow_classifier")
        return fc.get_flow_classifiers(context) if fc is not None else []


def unsupported_chain(obj: dict) -> str | None:
    correlation = (obj.get("chain_parameters") or {}).get("correlation")
    if correlation not in (None, "mpls"):
        return f"correlation {correlation}: fathom steers without a chain header (VNFs see ordinary packets)"
    return None


class PortChain(Mapping):
    kind = "port_chain"
    collection = "sfc/port_chains"
    order = 10
    immutable = ("symmetric",)
    mutable = ("name", "port_pair_groups", "flow_classifiers")

    def wanted(self, obj, refs):
        if unsupported_chain(obj):
            return None
        classifiers = [refs.id("sfc/flow_classifiers", fc) for fc in obj.get("flow_classifiers") or []]
        return {"name": (obj.get("name") or "")[:255],
                "port_pair_groups": [refs.id("sfc/port_pair_groups", g) for g in obj.get("port_pair_groups") or []],
                "flow_classifiers": classifiers, "symmetric": bool((obj.get("chain_parameters") or {}).get("symmetric")),
                "external_id": obj["id"]}

    def current(self, fathom_obj):
        return {**fathom_obj, "symmetric": bool(fathom_obj["chain_parameters"].get("symmetric"))}

    def create(self, api, body, project):
        body = dict(body)
        body["chain_parameters"] = {"symmetric": body.pop("symmetric")}
        return api.request("POST", f"/{self.collection}", project, json=body)

    def neutron_objects(self, context):
        sfc = _plugin("sfc")
        return sfc.get_port_chains(context) if sfc is not None else []


"""The fabric: the ToR's VLAN trunks and SVIs, the trunk pipe through br-phy, and the br-int flows
that send a fabric router's traffic up the trunk. The ToR is derived: a trunk port carries every
VLAN the node behind it can send, read from that node's desired br-int."""
from __future__ import annotations

from fathom.apps.base import BR_INT, BR_PHY, TOR, App, SwitchKey
from fathom.apps.fabric import compiler as fc
from fathom.pipeline.cookies import APP_FABRIC


def compile(model) -> dict:
    out = {SwitchKey(BR_INT, node): state for node, state in fc.compile_edges(model).items()}
    if model.fabric is not None and model.fabric.switches:
        out.update({SwitchKey(BR_PHY, node): state for node, state in fc.compile_phy(model).items()})
    return out


def derive(model, desired) -> dict:
    if model.fabric is None or not model.fabric.switches:
        return {}
    brint = {k.name: state for k, state in desired.items() if k.bridge == BR_INT}
    return {SwitchKey(TOR, name): state for name, state in fc.compile_tor(model, brint).items()}


APP = App("fabric", APP_FABRIC, {BR_INT: ("l2",), BR_PHY: ("normal",), TOR: ("trunk-in", "svi", "svi-neigh", "l2")},
          compile, derive)

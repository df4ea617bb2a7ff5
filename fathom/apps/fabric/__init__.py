"""The fabric: the ToR's VLAN trunks and SVIs, LLDP on br-phy, and the br-int flows that send a
fabric router's traffic up the trunk."""
from __future__ import annotations

from fathom.apps import BR_INT, BR_PHY, TOR, App, SwitchKey
from fathom.apps.fabric import compiler as fc
from fathom.pipeline.cookies import APP_FABRIC


def compile(model) -> dict:
    out = {SwitchKey(BR_INT, node): state for node, state in fc.compile_edges(model).items()}
    if model.fabric is not None and model.fabric.switches:
        out.update({SwitchKey(BR_PHY, node): state for node, state in fc.compile_phy(model).items()})
        out.update({SwitchKey(TOR, name): state for name, state in fc.compile_tor(model).items()})
    return out


APP = App("fabric", APP_FABRIC, {BR_INT: ("l2",), BR_PHY: ("normal",), TOR: ("trunk-in", "svi", "svi-neigh", "l2")},
          compile)

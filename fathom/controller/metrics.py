"""The reconciler's Prometheus families (fathom_reconciler_*): passes, whole and incremental
compiles, how switch changes were worked out, drift; and, read at each scrape from the last pass,
each switch's connection (fathom_switch_connected) and the objects by kind and status
(fathom_objects)."""
from __future__ import annotations

import collections
import weakref


class _Metrics:
    """The reconciler's Prometheus families, on prometheus_client's default registry (/metrics)."""
    _made: dict = {}

    def __getattr__(self, name):
        if not self._made:
            from prometheus_client import Counter
            self._made.update(
                passes=Counter("fathom_reconciler_passes", "reconcile passes", ["trigger"]),
                recomputes=Counter("fathom_reconciler_recomputes",
                                   "apps compiled whole where incremental compilation could not cover a change",
                                   ["app", "reason"]),
                incremental=Counter("fathom_reconciler_incremental_compiles",
                                    "apps compiled incrementally (only the owners a change touched)", ["app"]),
                diffs=Counter("fathom_reconciler_switch_diffs",
                              "switch changes worked out from a pass's edit of the desired state (edit) or "
                              "by a diff of the whole state (whole: unknown switch, audit, reconnect, refusal)",
                              ["how"]),
                drift=Counter("fathom_reconciler_drift",
                              "differences between a switch or node and what we installed or compiled with, "
                              "found by the periodic check or the audit", ["source"]),
                not_master=Counter("fathom_openflow_not_master",
                                   "switches' answers that this controller is not (any longer) their master: a "
                                   "write refused (is_slave), a master role request refused as stale (stale), "
                                   "a role status demoting it (demoted)", ["answer"]),
            )
        return self._made[name]


METRICS = _Metrics()


class _State:
    """A collector read at each scrape: what the last pass of the reconciler given to `export_state`
    left (nothing is kept between scrapes)."""
    reconciler = None    # weakref to the reconciler

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        reconciler = self.reconciler() if self.reconciler is not None else None
        if reconciler is None:
            return
        connected = GaugeMetricFamily(
            "fathom_switch_connected", "1 while the controller has an OpenFlow connection to the switch, "
            "0 while it has none (a switch of a registered node or fabric switch)", labels=["bridge", "switch"])
        for key, res in list(reconciler.results.items()):
            up = res.state != "not connected" and not res.state.startswith("lost")
            connected.add_metric([key.bridge, key.name], 1.0 if up else 0.0)
        yield connected
        objects = GaugeMetricFamily("fathom_objects", "objects by kind and status, as the last pass decided",
                                    labels=["kind", "status"])
        counts = collections.Counter((kind, st if isinstance(st, str) else st[0])
                                     for (kind, _), st in list(reconciler.board.statuses.items()) if st)
        for (kind, status), n in sorted(counts.items()):
            objects.add_metric([kind, status], float(n))
        yield objects


_STATE: _State | None = None


def export_state(reconciler) -> None:
    """Export `reconciler`'s switches and statuses on /metrics (the last one given, in a process)."""
    global _STATE
    if _STATE is None:
        from prometheus_client import REGISTRY
        _STATE = _State()
        REGISTRY.register(_STATE)
    _STATE.reconciler = weakref.ref(reconciler)

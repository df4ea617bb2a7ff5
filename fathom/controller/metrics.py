"""The reconciler's Prometheus families (fathom_reconciler_*): passes, whole and incremental
compiles, how switch changes were worked out, drift."""
from __future__ import annotations


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
            )
        return self._made[name]


METRICS = _Metrics()

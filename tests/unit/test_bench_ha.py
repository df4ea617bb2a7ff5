"""fathom bench ha's report and timeline plot from a results document (the events themselves run
in tests/lab/test_cluster_failover.py)."""
from __future__ import annotations

import xml.dom.minidom

from fathom.bench import ha
from fathom.bench.report import dist

DOC = {
    "lab": {"replicas": 3}, "timing": {"renew_s": 0.25, "lease_s": 1.0, "guard_s": 0.1},
    "events": [{"event": "kill", "replica": 1, "lease_s": 1.1, "applied_s": 1.6},
               {"event": "pause", "replica": 0, "paused_s": 30.0, "lease_s": None, "applied_s": None,
                "not_master_answers": {}, "in_sync": True},
               {"event": "rolling", "restart_s": [9.0, 8.5, 9.1], "applied_s": 0.7},
               {"event": "postgres", "down_s": 10.0, "settled_s": 0.7, "applied_s": 2.2}],
    "kill_applied_s": dist([1.6]),
    "echoes": {"vm1->198.19.45.12": {"sent": 1000, "lost": 2, "lost_seq": [5, 6]}},
    "writes": {"created": 10, "deleted": 10, "answers": {"201": 10, "503": 3}, "missing": [], "5xx_not_503": {}},
}


def test_the_report_gives_the_kill_figures_against_the_targets_and_every_event():
    text = ha.markdown(DOC)
    assert "p50 1.60 s (target <= 1.5), p99 1.60 s (target <= 3.0)" in text
    assert "| pause | 0 | - | - |" in text and "| rolling |  | - | 0.70 |" in text
    assert "echoes lost: 2 of 1000" in text


def test_the_timeline_plot_is_svg_with_a_row_per_timed_event(tmp_path):
    ha.plot(DOC, tmp_path / "timeline.svg")
    svg = xml.dom.minidom.parse(str(tmp_path / "timeline.svg"))
    labels = [t.firstChild.data for t in svg.getElementsByTagName("text")]
    assert {"kill r1", "rolling", "postgres"} <= set(labels) and "pause r0" not in labels
    assert len(svg.getElementsByTagName("rect")) == 3     # the first change on the switch, per timed event

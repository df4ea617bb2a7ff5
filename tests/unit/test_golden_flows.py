"""The desired flows of every shipped topology are exactly the committed ones (tests/unit/golden/).

A change of structure must not change what any switch is asked to hold. A deliberate change of
behaviour rewrites the file (`.venv/bin/python -m tests.unit.golden_flows --write`) and the diff
shows, flow by flow, what changed.
"""
from __future__ import annotations

import difflib

from tests.unit import golden_flows


def test_compiled_flows_match_the_golden_file():
    want = golden_flows.GOLDEN.read_text()
    got = golden_flows.render()
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                                 "golden", "compiled", n=1))[:80])
        raise AssertionError("compiled flows differ from tests/unit/golden/flows.txt:\n" + diff)

"""Benchmarks: the Python side (devices, modules, sweeps, reports, plots).

Each benchmark lives in its own module (`switch.py`, later `tenant.py`, `vtap.py` ...) and adds one
command to the `fathom bench` group in `fathom/cli/bench.py`. Per-packet work is done by the C engine
in `native/traffic` (see `engine.py`).
"""

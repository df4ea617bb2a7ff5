"""`make demo`, the first command the README gives a newcomer: every section runs and reports no
failure, and it leaves nothing behind (its labs, the PPTMon chain's namespaces)."""
import subprocess
import sys

from fathom.host import exec as host_exec
from fathom.lab.lab import Lab

NAME = "dm1"    # the demo's labs dm1, dm1t, dm1v, dm1f, dm1s; its PPTMon chain ppdm1


def test_the_demo_runs_every_section_and_cleans_up():
    out = subprocess.run([sys.executable, "-m", "fathom.demo", "--name", NAME],
                         capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    report = text.rsplit(" report ", 1)[-1]
    for line in ("ping same node", "ping cross node (VXLAN)", "TCP vm1 → vm3 (VXLAN)", "tenant lab up (controller)",
                 "routed blue vm1 → green grn2", "vTAP HTTP client → web to ids", "fabric switch port",
                 "router r1 moved to distributed", "chain fw → dpi → nat across 2 nodes",
                 "PPTMon chain fw → dpi → nat end to end", "pptmon"):
        assert line in report, f"{line!r} not in the demo's report:\n{report}"
    assert "FAILED" not in report, report
    for name in (NAME, NAME + "t", NAME + "v", NAME + "f", NAME + "s"):
        assert not Lab(name).exists(), f"lab {name} left up"
    assert not [ns for ns in host_exec.namespaces() if ns.startswith(f"pp{NAME}-")]

"""fathom.bench.procs.ThreadCpu: the scheduler's CPU count of process trees over a window, with the
threads and processes born and ended in it."""
import subprocess
import sys

from fathom.bench import procs

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
# the tree's root: at a line on stdin it runs a child that burns 0.4 s of CPU and exits, says so
ROOT = (f"import subprocess, sys\nsys.stdin.readline()\nsubprocess.run([sys.executable, '-c', {BURN!r}])\n"
        "print('done', flush=True)\nsys.stdin.read()\n")


def test_a_child_that_runs_and_ends_inside_the_window_is_counted():
    root = subprocess.Popen([sys.executable, "-c", ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        window = procs.ThreadCpu({"tree": root.pid}, every=0.05).start()
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline() == "done\n"
        out = window.stop()
    finally:
        root.communicate("")
    # the child's CPU, though it had ended before the window did (the /proc ticks of the processes
    # alive at the end would not count it)
    assert out["ms"]["tree"] >= 300, out
    assert out["born"]["tree"] >= 1 and out["ended"]["tree"] >= 1, out

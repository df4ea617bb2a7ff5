"""A benchmark's run directory is held by one process: a second benchmark given the same lab name is
refused before it touches the first one's controllers and stores."""
import os
import subprocess
import sys

from fathom.bench.scale.common import hold_run_dir


def test_second_holder_refused_until_first_lets_go(tmp_path):
    run_dir = tmp_path / "scale-bsc"
    first = hold_run_dir(run_dir)
    # another process, as a second `fathom bench scale --lab bsc` would be
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from fathom.bench.scale.common import hold_run_dir; hold_run_dir(Path(sys.argv[1]))",
                            str(run_dir)], capture_output=True, text=True)
    assert other.returncode != 0
    assert f"in use by process {os.getpid()}" in other.stderr
    assert "--lab" in other.stderr
    first.close()
    again = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from fathom.bench.scale.common import hold_run_dir; hold_run_dir(Path(sys.argv[1]))",
                            str(run_dir)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_cli_refuses_a_busy_lab(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from fathom.bench import scale as sc
    from fathom.cli.bench import bench
    monkeypatch.setattr(sc, "RUN_ROOT", tmp_path)
    held = hold_run_dir(tmp_path / "scale-busy")
    ran = []
    monkeypatch.setattr(sc, "run", lambda *a, **k: ran.append(a))
    try:
        result = CliRunner().invoke(bench, ["scale", "--lab", "busy", "--part", "api", "-o", str(tmp_path / "out")])
    finally:
        held.close()
    assert result.exit_code != 0
    assert "in use by process" in result.output
    assert not ran

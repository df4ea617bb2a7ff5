"""The one list of external programs (fathom/programs.py) names every program the code runs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fathom import programs
from tests.unit import program_calls

ROOT = Path(__file__).resolve().parents[2]

# Programs named by a path the project builds: its virtualenvs' and native/'s, not looked up on PATH.
OWN_PROGRAMS = {"python", "gunicorn", "openstack", "test-stats"}
# A name run on purpose although no such program exists (the runner's "not found" message is tested).
NOT_PROGRAMS = {"nft-missing-y"}


def programs_named(paths) -> dict[str, str]:
    """Program name -> first place the code names it at a program position (tests/unit/program_calls.py)."""
    found: dict[str, str] = {}
    for word, module, line in program_calls.scan(program_calls.load(ROOT, paths)):
        where = module.path.relative_to(ROOT) if module.path.is_relative_to(ROOT) else module.path.name
        found.setdefault(word, f"{where}:{line}")
    return found


def _code() -> list[Path]:
    return [p for p in sorted([*(ROOT / "fathom").rglob("*.py"), *(ROOT / "tests").rglob("*.py")])
            if p.name != "programs.py"]


def test_every_program_the_code_runs_is_in_the_list():
    used = programs_named(_code())
    unlisted = {p: where for p, where in used.items()
                if p not in programs.PROGRAMS and p not in OWN_PROGRAMS | NOT_PROGRAMS}
    assert not unlisted, f"add these to fathom/programs.py with their Debian package: {unlisted}"
    # the scanner finds programs we know are run: through subprocess, fathom's runners, `ip netns
    # exec NS prog`, wrappers with separate arguments (lab.run(vm, "ping")), paths (BIN / "initdb")
    assert {"ip", "ovs-vsctl", "ovs-vswitchd", "nft", "iperf3", "tcpdump", "tshark", "initdb", "ping",
            "udhcpc", "ovn-nbctl"} <= set(used)


def test_the_scanner_judges_the_code_not_the_machine(tmp_path):
    """Programs at argv positions are found whether or not they are installed; words elsewhere (click
    options, messages, data lists, CLI subcommands of a test helper) are not, even when a program
    of that name is installed."""
    mod = tmp_path / "sample.py"
    mod.write_text(
        "import subprocess\n"
        "import click\n"
        "from fathom.lab.sh import run\n"
        "def wrap(target, *cmd):\n"
        "    return run(['ip', 'netns', 'exec', target, *cmd])\n"
        "def cli(*args):\n"
        "    return click.testing.CliRunner().invoke(main, list(args))\n"
        "def f(lab):\n"
        "    subprocess.run(['frobnicate-x', '-v'])\n"
        "    cmd = ['whizbang-x', '--now']\n"
        "    subprocess.Popen(cmd)\n"
        "    wrap('vm1', 'zapper-x', '1')\n"
        "    run(['ip', 'netns', 'exec', 'ns1', 'inner-x'])\n"
        "    lab.run('vm1', 'labprog-x')\n"
        "    cli('network', 'create')\n"
        "    click.option('--project')\n"
        "    print('router', ['sh', 'ip'])\n")
    found = programs_named([mod, ROOT / "fathom" / "lab" / "lab.py", ROOT / "fathom" / "lab" / "sh.py"])
    sample = {p for p, where in found.items() if where.startswith("sample.py")}
    assert sample == {"ip", "frobnicate-x", "whizbang-x", "zapper-x", "inner-x", "labprog-x"}, sample


def test_every_listed_program_is_installed():
    missing = [p for p in programs.PROGRAMS if programs.path(p) is None]
    assert not missing, [programs.missing_message(p) for p in missing]


def test_setup_reads_the_list():
    out = subprocess.run([sys.executable, str(ROOT / "fathom/programs.py"), "packages"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == programs.packages()
    assert {"nftables", "iperf3", "openvswitch-switch", "postgresql", "tshark"} <= set(out)
    assert "programs.py packages" in (ROOT / "scripts/setup").read_text()
    assert "programs.py check" in (ROOT / "scripts/setup").read_text()


def test_missing_program_message_names_the_package():
    assert programs.missing_message("nft") == "nft not found (Debian package nftables; run 'sudo scripts/setup')"
    with pytest.raises(programs.ProgramMissing, match="no-such-program-x not found"):
        programs.require("ip", "no-such-program-x")


def test_lab_runner_reports_a_missing_program_from_the_list():
    from fathom.lab.sh import LabError, run
    with pytest.raises(LabError, match=r"^nft-missing-y not found"):
        run(["nft-missing-y", "list", "ruleset"])


def test_make_test_turns_a_skip_into_a_failure(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        "@pytest.mark.skipif(True, reason='tool missing')\n"
        "def test_marked(): pass\n"
        "def test_runtime(): pytest.skip('no root')\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
            "--rootdir", str(tmp_path), str(tmp_path / "test_skips.py")]
    by_hand = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "FATHOM_NO_SKIP"})
    assert by_hand.returncode == 0 and "2 skipped" in by_hand.stdout, by_hand.stdout
    under_make = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "FATHOM_NO_SKIP": "1"})
    assert under_make.returncode == 1, under_make.stdout
    assert "tool missing" in under_make.stdout and "no root" in under_make.stdout
    assert "nothing may skip under `make test`" in under_make.stdout

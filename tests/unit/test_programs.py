"""The one list of external programs (fathom/programs.py) names every program the code runs."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fathom import programs

ROOT = Path(__file__).resolve().parents[2]

# Strings that sit where a command name could and also name a program on this machine, but are data:
# click option values, table names, dictionary keys, words in messages, open() modes ("ab" is also
# ApacheBench once apache2-utils is installed).
NOT_COMMANDS = {
    "ab", "arp", "clear", "duplicates", "echo", "id", "init", "link", "node", "red", "reset", "route", "seq",
    "sum", "tr", "truncate", "w", "comm", "stat",
    "ab", "service",     # open(..., "ab"); the token role "service"
}


def _string_candidates(tree: ast.AST):
    """Strings in the positions where the code names a program: the first item of an argv list or
    tuple, a positional argument of a call (wrappers such as `lab.run(vm, "ping", ...)`), and the last
    part of a path joined with `/` (`BIN / "initdb"`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value, first.lineno
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.value, arg.lineno
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if isinstance(node.right, ast.Constant) and isinstance(node.right.value, str):
                yield node.right.value, node.right.lineno


def programs_the_code_runs() -> dict[str, str]:
    """Program name -> first place it is used, for every candidate that is an installed program."""
    found: dict[str, str] = {}
    for path in sorted([*(ROOT / "fathom").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path.name == "programs.py":
            continue
        for text, line in _string_candidates(ast.parse(path.read_text(), str(path))):
            if not text or not all(c.isalnum() or c in "-_.+" for c in text) or not text[0].isalpha():
                continue
            if text in NOT_COMMANDS:
                continue
            if programs.path(text) is not None:
                found.setdefault(text, f"{path.relative_to(ROOT)}:{line}")
    return found


def test_every_program_the_code_runs_is_in_the_list():
    used = programs_the_code_runs()
    unlisted = {p: where for p, where in used.items() if p not in programs.PROGRAMS}
    assert not unlisted, f"add these to fathom/programs.py with their Debian package: {unlisted}"
    # the scanner itself works: it finds programs we know the lab runs
    assert {"ip", "ovs-vsctl", "ovs-vswitchd", "nft", "iperf3", "tcpdump", "tshark", "initdb"} <= set(used)


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

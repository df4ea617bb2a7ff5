"""fathom.host.exec: a failed command names itself and what it printed; callers pick the error class."""
from __future__ import annotations

import pytest

from fathom.host import exec as host_exec
from fathom.host.iperf import client_args


def test_failure_carries_command_returncode_and_stderr():
    with pytest.raises(host_exec.CommandError) as e:
        host_exec.run(["sh", "-c", "echo out; echo broken pipe dream >&2; exit 3"])
    assert (e.value.returncode, e.value.cmd[:2]) == (3, ["sh", "-c"])
    assert "broken pipe dream" in str(e.value) and "exit 3" in str(e.value) and "(3)" in str(e.value)


def test_unchecked_failure_is_returned_and_env_adds_to_the_environment():
    p = host_exec.run(["sh", "-c", "echo $FATHOM_T; exit 2"], check=False, env={"FATHOM_T": "seen"})
    assert (p.returncode, p.stdout) == (2, "seen\n")


def test_timeout_and_caller_error_class():
    class Mine(Exception):
        pass
    with pytest.raises(Mine, match="timed out after 0.2s"):
        host_exec.run(["sleep", "5"], timeout=0.2, error=Mine)


def test_namespace_argv():
    assert host_exec.argv(["ping", "-c", 1], "ns1") == ["ip", "netns", "exec", "ns1", "ping", "-c", "1"]
    assert host_exec.argv(["true"]) == ["true"]


def test_iperf3_client_arguments():
    assert client_args("10.0.0.2", seconds=2, omit=1) == ["iperf3", "-c", "10.0.0.2", "-p", "5201", "-J", "-t", "2",
                                                          "-O", "1"]
    assert client_args("10.0.0.2", udp_mbps=500, length=1400)[-6:] == ["-t", "2", "-u", "-b", "500M", "-l", "1400"][-6:]
    assert "-n" in client_args("10.0.0.2", nbytes="300K", rate="20M") and "-t" not in client_args("x", nbytes="1K")

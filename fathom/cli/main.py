"""The `fathom` command. Each concern adds its verbs as one click group in its own module."""
import importlib

import click

from fathom import programs

# (module, attribute) of every command group; one line per concern.
GROUPS = [
    ("fathom.cli.lab", "lab"),
    ("fathom.cli.controller", "controller"),
    ("fathom.cli.controller", "flows"),
    ("fathom.cli.resources", "node"),
    ("fathom.cli.resources", "network"),
    ("fathom.cli.resources", "subnet"),
    ("fathom.cli.resources", "port"),
    ("fathom.cli.resources", "router"),
    ("fathom.cli.floatingip", "floatingip"),   # floating IPs of external networks
    ("fathom.cli.bench", "bench"),
    ("fathom.cli.bench_l3", "bench"),   # adds `bench l3` to the bench group
    ("fathom.cli.bench_external", "bench"),   # adds `bench external`
    ("fathom.cli.bench_ovn", "bench"),  # adds `bench ovn-compare` to the bench group
    ("fathom.cli.fabric", "fabric"),
    ("fathom.cli.pptmon", "pptmon"),
    ("fathom.cli.secgroup", "security_group"),
    ("fathom.cli.tap", "tap"),
    ("fathom.cli.sfc", "sfc"),           # service function chains (networking-sfc's resources)
    ("fathom.cli.token", "token"),       # API tokens
    ("fathom.cli.pki", "pki"),           # CAs and certificates of the control channels
    ("fathom.cli.agent", "agent"),       # node agent (PPTMon delivery)
]


class _Fathom(click.Group):
    """Reports a missing external program as one line naming its Debian package, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except programs.ProgramMissing as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Fathom, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fathom")
def cli():
    """fathom: tenant networking, vTAP, service chains, PPTMon and switch benchmarks on Open vSwitch."""


for module, attr in GROUPS:
    cli.add_command(getattr(importlib.import_module(module), attr))

if __name__ == "__main__":
    cli()

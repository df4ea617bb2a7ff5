"""The `fathom` command. Each concern adds its verbs as one click group in its own module.

A group's module is imported only when its command runs (or help lists it): `fathom agent run`,
a small process on every node, loads the agent and not the lab, the benchmarks or the API."""
import importlib

import click

from fathom import programs

# (command name, module, attribute) of every command group; one line per concern.
GROUPS = [
    ("lab", "fathom.cli.lab", "lab"),
    ("controller", "fathom.cli.controller", "controller"),
    ("flows", "fathom.cli.controller", "flows"),
    ("trace", "fathom.cli.trace", "trace"),       # a packet through the desired (or actual) pipelines
    ("node", "fathom.cli.node", "node"),
    ("network", "fathom.cli.network", "network"),
    ("subnet", "fathom.cli.subnet", "subnet"),
    ("port", "fathom.cli.port", "port"),
    ("router", "fathom.cli.router", "router"),
    ("floatingip", "fathom.cli.floatingip", "floatingip"),   # floating IPs of external networks
    ("bench", "fathom.cli.bench", "bench"),
    ("bench", "fathom.cli.bench_l3", "bench"),   # adds `bench l3` to the bench group
    ("bench", "fathom.cli.bench_external", "bench"),   # adds `bench external`
    ("bench", "fathom.cli.bench_ovn", "bench"),  # adds `bench ovn-compare` to the bench group
    ("bench", "fathom.cli.pptmon", None),        # adds `bench pptmon` to the bench group
    ("fabric", "fathom.cli.fabric", "fabric"),
    ("pptmon", "fathom.cli.pptmon", "pptmon"),
    ("security-group", "fathom.cli.secgroup", "security_group"),
    ("tap", "fathom.cli.tap", "tap"),
    ("sfc", "fathom.cli.sfc", "sfc"),           # service function chains (networking-sfc's resources)
    ("token", "fathom.cli.token", "token"),       # API tokens
    ("pki", "fathom.cli.pki", "pki"),           # CAs and certificates of the control channels
    ("agent", "fathom.cli.agent", "agent"),       # node agent (PPTMon delivery)
    ("cluster", "fathom.cli.cluster", "cluster"),   # controller replicas and their switch leases
    ("flow-records", "fathom.cli.flow_records", "flow_records"),   # IPFIX flow records per tenant
]


class _Fathom(click.Group):
    """Loads a command group when it is used; reports a missing external program as one line
    naming its Debian package, not a traceback."""

    def list_commands(self, ctx):
        return sorted({name for name, _, _ in GROUPS} | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands:
            found = None
            for command, module, attr in GROUPS:
                if command == name:   # every module of the name (later ones add to the group)
                    loaded = importlib.import_module(module)
                    found = found or (getattr(loaded, attr) if attr else None)
            if found is not None:
                self.commands[name] = found
        return self.commands.get(name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except programs.ProgramMissing as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Fathom, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fathom")
def cli():
    """fathom: tenant networking, vTAP, service chains, PPTMon and switch benchmarks on Open vSwitch."""


if __name__ == "__main__":
    cli()

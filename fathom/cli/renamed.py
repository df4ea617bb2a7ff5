"""Old spellings of options that were renamed to the API's names (docs/api.md, "Names").

`renamed("--owner", "project_id")` keeps `--owner` working as the option whose value lands in
`project_id` (`--project-id`) for one release: hidden from --help, and a deprecation note on
stderr each time it is used. Place it above the option it stands for."""
from __future__ import annotations

import functools

import click


def _given(value) -> bool:
    return value not in (None, (), False)


def renamed(old: str, dest: str):
    """A hidden, deprecated `old` spelling of the option of the command whose parameter is `dest`."""
    def decorate(fn):
        new = next(p for p in getattr(fn, "__click_params__", []) if p.name == dest)
        hidden = f"renamed_{old.lstrip('-').replace('-', '_')}"

        @functools.wraps(fn)
        def command(*args, **kwargs):
            value = kwargs.pop(hidden)
            if _given(value):
                click.echo(f"warning: {old} is deprecated and will be removed: use {new.opts[0]}", err=True)
                if _given(kwargs[dest]):
                    raise click.UsageError(f"{old} is the old spelling of {new.opts[0]}: give one of them")
                kwargs[dest] = value
            return fn(*args, **kwargs)
        return click.option(old, hidden, hidden=True, is_flag=new.is_flag, multiple=new.multiple,
                            type=None if new.is_flag else new.type, metavar=new.metavar)(command)
    return decorate

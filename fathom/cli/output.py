"""Shared output helpers: every command that prints a table also offers --json."""
import json
import sys

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: list[str], rows: list[list]) -> None:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)


def fail(message: str, code: int = 1):
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    sys.exit(code)


def print_record(title: str | None, record: dict) -> None:
    """One object as a two-column table: field, value (lists joined, nested dicts as JSON)."""
    rows = []
    for key, value in record.items():
        if isinstance(value, list):
            value = " ".join(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value)
        rows.append([key, value])
    print_table(title, ["field", "value"], rows)

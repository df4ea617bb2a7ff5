"""Shared output helpers: every command that prints a table also offers --json.

What the controller returns is the tenants' text: a name may hold terminal control sequences (an
ESC that rewrites the operator's screen) or rich markup. Tables and error lines print it as plain
text with control characters (C0, DEL, C1) and bidirectional overrides escaped (`terminal_safe`);
--json prints exact JSON (those characters as \\u escapes)."""
import json
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, soft_wrap=True)

# bidirectional embeddings, overrides, isolates and marks: they reorder what follows them on screen
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_ESCAPES = {**{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))},
            **{ord(ch): f"\\u{ord(ch):04x}" for ch in _BIDI}}


def terminal_safe(text: str) -> str:
    """`text` with every control character and bidi override written as a visible escape (\\x1b)."""
    return text.translate(_ESCAPES)


def plain(value) -> Text:
    """A value as terminal-safe text that rich prints as it is (no markup)."""
    return Text("" if value is None else terminal_safe(str(value)))


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: list[str], rows: list[list]) -> None:
    table = Table(title=None if title is None else plain(title), title_justify="left")
    for c in columns:
        table.add_column(plain(c))
    for r in rows:
        table.add_row(*(plain(v) for v in r))
    console.print(table)


def fail(message: str, code: int = 1):
    err_console.print(Text.assemble(("error:", "red"), " ", terminal_safe(message)))
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

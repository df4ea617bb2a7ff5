"""The suite's throw-away PostgreSQL server (fsync off): fathom.bench.postgres, shared with the benchmarks."""
from fathom.bench.postgres import BIN, PORT, PostgresServer  # noqa: F401

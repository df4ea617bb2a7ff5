"""Alembic environment: runs on the connection fathom.store.db.migrate() hands over."""
from alembic import context

from fathom.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("fathom migrations run through fathom.store.db.migrate(), not the alembic CLI")

context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()

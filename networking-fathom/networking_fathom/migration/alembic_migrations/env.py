"""Alembic environment of networking-fathom's migrations, run by neutron-db-manage: Neutron's
database, this project's own version table."""
from alembic import context
from neutron.db.migration.connection import DBConnection
from neutron_lib.db import model_base

import networking_fathom.db  # noqa: F401  the models the migrations create

VERSION_TABLE = "alembic_version_fathom"
config = context.config
neutron_config = config.neutron_config


def run_migrations_offline():
    context.configure(url=neutron_config.database.connection, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    with DBConnection(neutron_config.database.connection, config.attributes.get("connection")) as conn:
        context.configure(connection=conn, target_metadata=model_base.BASEV2.metadata,
                          version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

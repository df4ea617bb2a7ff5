"""external_id on networks, subnets, routers, ports and tap policies: the id of the object in the cloud that drives
fathom (Neutron's UUID), unique per table.

Revision ID: 0009_neutron
Revises: 0008_sfc
"""
import sqlalchemy as sa
from alembic import op

revision = "0009_neutron"
down_revision = "0008_sfc"
branch_labels = None
depends_on = None

TABLES = ("networks", "subnets", "routers", "ports", "tap_policies")


def upgrade() -> None:
    # a plain column and a unique index: no table rebuild on SQLite (its ALTER cannot add constraints)
    for table in TABLES:
        op.add_column(table, sa.Column("external_id", sa.String(length=64), nullable=True))
        op.create_index(op.f(f"ix_{table}_external_id"), table, ["external_id"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(op.f(f"ix_{table}_external_id"), table_name=table)
        op.drop_column(table, "external_id")

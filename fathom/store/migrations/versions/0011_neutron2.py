"""external_id on security groups and their rules, floating IPs and the service-chain objects (port
pairs, port pair groups, flow classifiers, port chains): Neutron's UUIDs, unique per table, as 0009.

Revision ID: 0011_neutron2
Revises: 0010_external
"""
import sqlalchemy as sa
from alembic import op

revision = "0011_neutron2"
down_revision = "0010_external"
branch_labels = None
depends_on = None

TABLES = ("security_groups", "security_group_rules", "floating_ips", "sfc_port_pairs", "sfc_port_pair_groups",
          "sfc_flow_classifiers", "sfc_port_chains")


def upgrade() -> None:
    # a plain column and a unique index: no table rebuild on SQLite (its ALTER cannot add constraints)
    for table in TABLES:
        op.add_column(table, sa.Column("external_id", sa.String(length=64), nullable=True))
        op.create_index(op.f(f"ix_{table}_external_id"), table, ["external_id"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(op.f(f"ix_{table}_external_id"), table_name=table)
        op.drop_column(table, "external_id")

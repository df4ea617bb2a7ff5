"""DHCP of subnets: enable_dhcp, DNS servers, host routes, and the DHCP servers' status.

Revision ID: 0012_dhcp
Revises: 0010_external
"""
import sqlalchemy as sa
from alembic import op

revision = "0012_dhcp"
down_revision = "0011_neutron2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain columns: no table rebuild on SQLite (subnets are referenced by ip_allocations)
    op.add_column("subnets", sa.Column("enable_dhcp", sa.Boolean(), nullable=False, server_default=sa.true()))
    for column in ("dns_nameservers", "host_routes", "dhcp_status"):
        op.add_column("subnets", sa.Column(column, sa.JSON(), nullable=False, server_default=sa.text("'[]'")))


def downgrade() -> None:
    for column in ("dhcp_status", "host_routes", "dns_nameservers", "enable_dhcp"):
        op.drop_column("subnets", column)

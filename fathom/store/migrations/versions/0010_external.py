"""External networks, router gateways, floating IPs.

Revision ID: 0010_external
Revises: 0009_neutron
"""
import sqlalchemy as sa
from alembic import op

revision = "0010_external"
down_revision = "0009_neutron"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain columns: no table rebuild on SQLite (a rebuild of networks fails once ports reference it)
    op.add_column("networks", sa.Column("external", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("networks", sa.Column("upstream_mac", sa.String(length=17), nullable=True))
    op.create_table(
        "router_gateways",
        sa.Column("router_id", sa.Integer(), nullable=False),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("address_port_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("ct_zone", sa.Integer(), nullable=False),
        sa.Column("snat", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["router_id"], ["routers.id"], ondelete="CASCADE",
                                name=op.f("fk_router_gateways_router_id_routers")),
        sa.ForeignKeyConstraint(["network_id"], ["networks.id"], ondelete="RESTRICT",
                                name=op.f("fk_router_gateways_network_id_networks")),
        sa.ForeignKeyConstraint(["address_port_id"], ["ports.id"], ondelete="RESTRICT",
                                name=op.f("fk_router_gateways_address_port_id_ports")),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="RESTRICT",
                                name=op.f("fk_router_gateways_node_id_nodes")),
        sa.PrimaryKeyConstraint("router_id", name=op.f("pk_router_gateways")),
        sa.UniqueConstraint("ct_zone", name=op.f("uq_router_gateways_ct_zone")),
    )
    for column in ("network_id", "address_port_id", "node_id"):
        op.create_index(op.f(f"ix_router_gateways_{column}"), "router_gateways", [column], unique=False)
    op.create_table(
        "floating_ips",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("address_port_id", sa.Integer(), nullable=False),
        sa.Column("ip_address", sa.String(length=64), nullable=False),
        sa.Column("port_id", sa.Integer(), nullable=True),
        sa.Column("fixed_ip", sa.String(length=64), nullable=True),
        sa.Column("router_id", sa.Integer(), nullable=True),
        sa.Column("ct_zone", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["network_id"], ["networks.id"], ondelete="RESTRICT",
                                name=op.f("fk_floating_ips_network_id_networks")),
        sa.ForeignKeyConstraint(["address_port_id"], ["ports.id"], ondelete="RESTRICT",
                                name=op.f("fk_floating_ips_address_port_id_ports")),
        sa.ForeignKeyConstraint(["port_id"], ["ports.id"], ondelete="SET NULL",
                                name=op.f("fk_floating_ips_port_id_ports")),
        sa.ForeignKeyConstraint(["router_id"], ["routers.id"], ondelete="RESTRICT",
                                name=op.f("fk_floating_ips_router_id_routers")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_floating_ips")),
        sa.UniqueConstraint("ct_zone", name=op.f("uq_floating_ips_ct_zone")),
        sa.UniqueConstraint("port_id", name=op.f("uq_floating_ips_port_id")),
        sqlite_autoincrement=True,
    )
    for column in ("project_id", "network_id", "address_port_id", "router_id"):
        op.create_index(op.f(f"ix_floating_ips_{column}"), "floating_ips", [column], unique=False)


def downgrade() -> None:
    op.drop_table("floating_ips")
    op.drop_table("router_gateways")
    op.drop_column("networks", "upstream_mac")
    op.drop_column("networks", "external")

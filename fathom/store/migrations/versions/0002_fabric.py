"""Fabric: top-of-rack switches, their links to nodes, router modes.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fabric_switches",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("management_ip", sa.String(length=64), nullable=False),
        sa.Column("bridge", sa.String(length=64), nullable=False),
        sa.Column("vlan_min", sa.Integer(), nullable=False),
        sa.Column("vlan_max", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fabric_switches")),
        sa.UniqueConstraint("name", name=op.f("uq_fabric_switches_name")),
        sqlite_autoincrement=True)
    op.create_index(op.f("ix_fabric_switches_project_id"), "fabric_switches", ["project_id"], unique=False)

    op.create_table(
        "fabric_links",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("switch_id", sa.Integer(), nullable=False),
        sa.Column("port_name", sa.String(length=64), nullable=False),
        sa.Column("ofport", sa.Integer(), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["switch_id"], ["fabric_switches.id"], ondelete="CASCADE",
                                name=op.f("fk_fabric_links_switch_id_fabric_switches")),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE",
                                name=op.f("fk_fabric_links_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fabric_links")),
        sa.UniqueConstraint("switch_id", "port_name", "source",
                            name=op.f("uq_fabric_links_switch_id_port_name_source")),
        sqlite_autoincrement=True)
    op.create_index(op.f("ix_fabric_links_switch_id"), "fabric_links", ["switch_id"], unique=False)
    op.create_index(op.f("ix_fabric_links_node_id"), "fabric_links", ["node_id"], unique=False)

    op.create_table(
        "router_modes",
        sa.Column("router_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("gateway_node_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["router_id"], ["routers.id"], ondelete="CASCADE",
                                name=op.f("fk_router_modes_router_id_routers")),
        sa.ForeignKeyConstraint(["gateway_node_id"], ["nodes.id"], ondelete="RESTRICT",
                                name=op.f("fk_router_modes_gateway_node_id_nodes")),
        sa.PrimaryKeyConstraint("router_id", name=op.f("pk_router_modes")))
    op.create_index(op.f("ix_router_modes_gateway_node_id"), "router_modes", ["gateway_node_id"], unique=False)


def downgrade() -> None:
    for table in ("router_modes", "fabric_links", "fabric_switches"):
        op.drop_table(table)

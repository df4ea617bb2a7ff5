"""Initial schema: nodes, networks, subnets, routers, ports (and router interfaces), IP allocations.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _object_columns():
    """Columns every resource has (fathom.store.base.Resource)."""
    return [
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    ]


def _fk(table, column, target, ondelete):
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], ondelete=ondelete,
                                   name=op.f(f"fk_{table}_{column}_{target}"))


def _indexes(table, *columns):
    for column in columns:
        op.create_index(op.f(f"ix_{table}_{column}"), table, [column], unique=False)


def upgrade() -> None:
    op.create_table(
        "nodes", *_object_columns(),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tunnel_ip", sa.String(length=64), nullable=True),
        sa.Column("management_ip", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
        sqlite_autoincrement=True)
    _indexes("nodes", "project_id")

    op.create_table(
        "networks", *_object_columns(),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("segmentation_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_networks")),
        sa.UniqueConstraint("type", "segmentation_id", name=op.f("uq_networks_type_segmentation_id")),
        sqlite_autoincrement=True)
    _indexes("networks", "project_id")

    op.create_table(
        "subnets", *_object_columns(),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("cidr", sa.String(length=64), nullable=False),
        sa.Column("gateway_ip", sa.String(length=64), nullable=True),
        _fk("subnets", "network_id", "networks", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subnets")),
        sqlite_autoincrement=True)
    _indexes("subnets", "network_id", "project_id")

    op.create_table(
        "routers", *_object_columns(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routers")),
        sqlite_autoincrement=True)
    _indexes("routers", "project_id")

    op.create_table(
        "ports", *_object_columns(),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("mac_address", sa.String(length=17), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("interface_name", sa.String(length=64), nullable=True),
        sa.Column("port_security", sa.Boolean(), nullable=False),
        sa.Column("router_id", sa.Integer(), nullable=True),
        _fk("ports", "network_id", "networks", "RESTRICT"),
        _fk("ports", "node_id", "nodes", "RESTRICT"),
        _fk("ports", "router_id", "routers", "RESTRICT"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ports")),
        sa.UniqueConstraint("network_id", "mac_address", name=op.f("uq_ports_network_id_mac_address")),
        sa.UniqueConstraint("node_id", "interface_name", name=op.f("uq_ports_node_id_interface_name")),
        sqlite_autoincrement=True)
    _indexes("ports", "network_id", "node_id", "project_id", "router_id")

    op.create_table(
        "ip_allocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("port_id", sa.Integer(), nullable=False),
        sa.Column("subnet_id", sa.Integer(), nullable=False),
        sa.Column("network_id", sa.Integer(), nullable=False),
        sa.Column("ip_address", sa.String(length=64), nullable=False),
        _fk("ip_allocations", "network_id", "networks", "RESTRICT"),
        _fk("ip_allocations", "port_id", "ports", "CASCADE"),
        _fk("ip_allocations", "subnet_id", "subnets", "RESTRICT"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ip_allocations")),
        sa.UniqueConstraint("network_id", "ip_address", name=op.f("uq_ip_allocations_network_id_ip_address")),
        sqlite_autoincrement=True)
    _indexes("ip_allocations", "port_id", "subnet_id")


def downgrade() -> None:
    for table in ("ip_allocations", "ports", "routers", "subnets", "networks", "nodes"):
        op.drop_table(table)

"""Service function chains: port pairs, port pair groups, flow classifiers, port chains.

Revision ID: 0008_sfc
Revises: 0007_secgroups
"""
import sqlalchemy as sa
from alembic import op

revision = "0008_sfc"
down_revision = "0007_secgroups"
branch_labels = None
depends_on = None


def _resource(table: str) -> list:
    return [sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("name", sa.String(length=255), nullable=False),
            sa.Column("project_id", sa.String(length=64), nullable=False),
            sa.Column("status", sa.String(length=16), nullable=False),
            sa.Column("status_reason", sa.String(length=1024), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}"))]


def _fk(table: str, column: str, target: str, ondelete: str):
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], ondelete=ondelete,
                                   name=op.f(f"fk_{table}_{column}_{target}"))


def upgrade() -> None:
    op.create_table("sfc_port_chains", *_resource("sfc_port_chains"),
                    sa.Column("symmetric", sa.Boolean(), nullable=False),
                    sqlite_autoincrement=True)
    op.create_table("sfc_port_pair_groups", *_resource("sfc_port_pair_groups"),
                    sa.Column("chain_id", sa.Integer(), nullable=True),
                    sa.Column("position", sa.Integer(), nullable=True),
                    _fk("sfc_port_pair_groups", "chain_id", "sfc_port_chains", "SET NULL"),
                    sa.UniqueConstraint("chain_id", "position", name=op.f("uq_sfc_port_pair_groups_chain_id_position")),
                    sqlite_autoincrement=True)
    op.create_table("sfc_port_pairs", *_resource("sfc_port_pairs"),
                    sa.Column("ingress_port_id", sa.Integer(), nullable=False),
                    sa.Column("egress_port_id", sa.Integer(), nullable=False),
                    sa.Column("group_id", sa.Integer(), nullable=True),
                    _fk("sfc_port_pairs", "ingress_port_id", "ports", "RESTRICT"),
                    _fk("sfc_port_pairs", "egress_port_id", "ports", "RESTRICT"),
                    _fk("sfc_port_pairs", "group_id", "sfc_port_pair_groups", "SET NULL"),
                    sa.UniqueConstraint("ingress_port_id", name=op.f("uq_sfc_port_pairs_ingress_port_id")),
                    sa.UniqueConstraint("egress_port_id", name=op.f("uq_sfc_port_pairs_egress_port_id")),
                    sqlite_autoincrement=True)
    op.create_table("sfc_flow_classifiers", *_resource("sfc_flow_classifiers"),
                    sa.Column("logical_source_port_id", sa.Integer(), nullable=False),
                    sa.Column("logical_destination_port_id", sa.Integer(), nullable=True),
                    sa.Column("protocol", sa.Integer(), nullable=True),
                    sa.Column("source_ip_prefix", sa.String(length=64), nullable=True),
                    sa.Column("destination_ip_prefix", sa.String(length=64), nullable=True),
                    sa.Column("source_port_range_min", sa.Integer(), nullable=True),
                    sa.Column("source_port_range_max", sa.Integer(), nullable=True),
                    sa.Column("destination_port_range_min", sa.Integer(), nullable=True),
                    sa.Column("destination_port_range_max", sa.Integer(), nullable=True),
                    sa.Column("chain_id", sa.Integer(), nullable=True),
                    _fk("sfc_flow_classifiers", "logical_source_port_id", "ports", "RESTRICT"),
                    _fk("sfc_flow_classifiers", "logical_destination_port_id", "ports", "RESTRICT"),
                    _fk("sfc_flow_classifiers", "chain_id", "sfc_port_chains", "SET NULL"),
                    sqlite_autoincrement=True)
    for table, columns in (("sfc_port_chains", ["project_id"]),
                           ("sfc_port_pair_groups", ["project_id", "chain_id"]),
                           ("sfc_port_pairs", ["project_id", "group_id"]),
                           ("sfc_flow_classifiers", ["project_id", "logical_source_port_id",
                                                     "logical_destination_port_id", "chain_id"])):
        for column in columns:
            op.create_index(op.f(f"ix_{table}_{column}"), table, [column], unique=False)


def downgrade() -> None:
    for table in ("sfc_flow_classifiers", "sfc_port_pairs", "sfc_port_pair_groups", "sfc_port_chains"):
        op.drop_table(table)

"""Cluster: the replicas sharing the store and one mastership lease per switch.

Revision ID: 0015_cluster
Revises: 0014_taas
"""
import sqlalchemy as sa
from alembic import op

revision = "0015_cluster"
down_revision = "0014_taas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_replicas",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema_version", sa.String(64), nullable=False),
        sa.Column("pki_fingerprint", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_replicas")),
    )
    op.create_table(
        "cluster_leases",
        sa.Column("switch", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(64), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=True),
        sa.Column("renewed", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("switch", name=op.f("pk_cluster_leases")),
    )
    op.create_index(op.f("ix_cluster_leases_holder"), "cluster_leases", ["holder"])


def downgrade() -> None:
    op.drop_index(op.f("ix_cluster_leases_holder"), table_name="cluster_leases")
    op.drop_table("cluster_leases")
    op.drop_table("cluster_replicas")

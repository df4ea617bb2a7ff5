"""Cluster wiring: where each replica's OpenFlow listener is reached (the switches are given every
live replica as controller), the switches it reaches, and the lag of its change feed.

Revision ID: 0016_cluster_wiring
Revises: 0015_cluster
"""
import sqlalchemy as sa
from alembic import op

revision = "0016_cluster_wiring"
down_revision = "0015_cluster"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cluster_replicas", sa.Column("openflow", sa.String(255), nullable=False, server_default=""))
    op.add_column("cluster_replicas", sa.Column("feed_lag", sa.Float(), nullable=True))
    op.add_column("cluster_replicas", sa.Column("reaches", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("cluster_replicas", "reaches")
    op.drop_column("cluster_replicas", "feed_lag")
    op.drop_column("cluster_replicas", "openflow")

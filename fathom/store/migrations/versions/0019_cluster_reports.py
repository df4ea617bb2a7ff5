"""Cluster reports: with each heartbeat a replica writes the nodes whose agents it hears and what
the switches it masters say that is not simply `ok` (their state, the objects whose flows they
refused), so every replica decides the same statuses and sees every agent.

Revision ID: 0019_cluster_reports
Revises: 0018_flow_records
"""
import sqlalchemy as sa
from alembic import op

revision = "0019_cluster_reports"
down_revision = "0018_flow_records"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cluster_replicas", sa.Column("agents", sa.Text(), nullable=True))
    op.add_column("cluster_replicas", sa.Column("switch_states", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("cluster_replicas", "switch_states")
    op.drop_column("cluster_replicas", "agents")

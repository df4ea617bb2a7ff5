"""Node agents (reports, desired-state revisions), PPTMon attachments, per-node datapath type.

Revision ID: 0006_agent
Revises: 0005_tokens
"""
import sqlalchemy as sa
from alembic import op

revision = "0006_agent"
down_revision = "0005_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("datapath_type", sa.String(length=16), nullable=True))
    op.create_table(
        "node_agents",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("applied_revision", sa.Integer(), nullable=True),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("objects", sa.JSON(), nullable=False),
        sa.Column("agent_started", sa.BigInteger(), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_node_agents_node_id_nodes"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_agents")),
    )
    op.create_table(
        "pptmon_attachments",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("chain", sa.String(length=64), nullable=False),
        sa.Column("vnf_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("in_interface", sa.String(length=15), nullable=False),
        sa.Column("in_direction", sa.String(length=8), nullable=False),
        sa.Column("out_interface", sa.String(length=15), nullable=False),
        sa.Column("out_direction", sa.String(length=8), nullable=False),
        sa.Column("period_ns", sa.BigInteger(), nullable=False),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_pptmon_attachments_node_id_nodes"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pptmon_attachments")),
        sa.UniqueConstraint("name", name=op.f("uq_pptmon_attachments_name")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_pptmon_attachments_node_id"), "pptmon_attachments", ["node_id"])
    op.create_index(op.f("ix_pptmon_attachments_project_id"), "pptmon_attachments", ["project_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_pptmon_attachments_project_id"), table_name="pptmon_attachments")
    op.drop_index(op.f("ix_pptmon_attachments_node_id"), table_name="pptmon_attachments")
    op.drop_table("pptmon_attachments")
    op.drop_table("node_agents")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("datapath_type")

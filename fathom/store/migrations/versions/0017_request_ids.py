"""Request ids of writes (Idempotency-Key): a write sent twice runs once.

Revision ID: 0017_request_ids
Revises: 0015_cluster
"""
import sqlalchemy as sa
from alembic import op

revision = "0017_request_ids"
down_revision = "0016_cluster_wiring"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_ids",
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("content_type", sa.String(128), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("scope", "key", name=op.f("pk_request_ids")),
    )
    op.create_index(op.f("ix_request_ids_created"), "request_ids", ["created"])


def downgrade() -> None:
    op.drop_index(op.f("ix_request_ids_created"), table_name="request_ids")
    op.drop_table("request_ids")

"""API tokens (stored as SHA-256 digests).

Revision ID: 0005_tokens
Revises: 0004_pptmon
"""
import sqlalchemy as sa
from alembic import op

revision = "0005_tokens"
down_revision = "0004_pptmon"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("roles", sa.String(length=255), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_tokens_digest")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("api_tokens")

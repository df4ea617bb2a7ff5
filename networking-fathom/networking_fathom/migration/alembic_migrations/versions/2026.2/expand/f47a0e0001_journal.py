"""The journal of writes toward fathom (networking_fathom.db.JournalEntry).

Revision ID: f47a0e0001
Revises: fathom_start
"""
import sqlalchemy as sa
from alembic import op
from neutron.db.migration import cli

revision = "f47a0e0001"
down_revision = "fathom_start"
branch_labels = (cli.EXPAND_BRANCH,)


def upgrade():
    op.create_table(
        "fathom_journal",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("object_type", sa.String(36), nullable=False),
        sa.Column("object_uuid", sa.String(36), nullable=False, index=True),
        sa.Column("operation", sa.String(16), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("project_id", sa.String(255), nullable=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.String(1024), nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=True),
    )

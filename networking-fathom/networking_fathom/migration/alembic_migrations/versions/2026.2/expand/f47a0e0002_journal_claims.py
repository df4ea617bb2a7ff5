"""Journal entries claimed by one Neutron worker at a time (networking_fathom.db.claim).

Revision ID: f47a0e0002
Revises: f47a0e0001
"""
import sqlalchemy as sa
from alembic import op

revision = "f47a0e0002"
down_revision = "f47a0e0001"


def upgrade():
    op.add_column("fathom_journal", sa.Column("claimed_at", sa.DateTime, nullable=True))

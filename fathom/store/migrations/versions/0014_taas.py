"""vTAP: a policy's sender may be "*" (anyone), tapping what the receiver port receives.

Revision ID: 0014_taas
Revises: 0013_ppt
"""
import sqlalchemy as sa
from alembic import op

revision = "0014_taas"
down_revision = "0013_ppt"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tap_policies", sa.Column("sender_is_port", sa.Boolean(), nullable=False,
                                            server_default=sa.true()))


def downgrade() -> None:
    op.drop_column("tap_policies", "sender_is_port")

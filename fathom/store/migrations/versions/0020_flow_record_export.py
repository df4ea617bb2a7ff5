"""Flow records: the external IPFIX collector they are forwarded to.

Revision ID: 0020_flow_record_export
Revises: 0019_cluster_reports
"""
import sqlalchemy as sa
from alembic import op

revision = "0020_flow_record_export"
down_revision = "0019_cluster_reports"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flow_record_export",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(45), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_flow_record_export")),
    )


def downgrade() -> None:
    op.drop_table("flow_record_export")

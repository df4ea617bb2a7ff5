"""vTAP policies.

Revision ID: 0003_vtap
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003_vtap"
down_revision = "0002"
branch_labels = None
depends_on = None


def _port_fk(column):
    return sa.ForeignKeyConstraint([column], ["ports.id"], ondelete="SET NULL",
                                   name=op.f(f"fk_tap_policies_{column}_ports"))


def upgrade() -> None:
    op.create_table(
        "tap_policies",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sender_port_id", sa.Integer(), nullable=True),
        sa.Column("receiver_port_id", sa.Integer(), nullable=True),
        sa.Column("receiver_is_port", sa.Boolean(), nullable=False),
        sa.Column("receiver_mac", sa.String(length=17), nullable=False),
        sa.Column("receiver_ip", sa.String(length=64), nullable=False),
        sa.Column("monitor_port_id", sa.Integer(), nullable=True),
        sa.Column("monitor2_port_id", sa.Integer(), nullable=True),
        sa.Column("has_monitor2", sa.Boolean(), nullable=False),
        sa.Column("direction", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("filters", sa.JSON(), nullable=False),
        sa.Column("truncate", sa.Integer(), nullable=True),
        sa.Column("rate_pps", sa.Integer(), nullable=True),
        *(_port_fk(c) for c in ("sender_port_id", "receiver_port_id", "monitor_port_id",
                                "monitor2_port_id")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tap_policies")),
        sqlite_autoincrement=True)
    for column in ("project_id", "sender_port_id", "receiver_port_id", "monitor_port_id",
                   "monitor2_port_id"):
        op.create_index(op.f(f"ix_tap_policies_{column}"), "tap_policies", [column], unique=False)


def downgrade() -> None:
    op.drop_table("tap_policies")

"""PPTMon records delivered by agents.

Revision ID: 0004_pptmon
Revises: 0003_vtap
"""
import sqlalchemy as sa
from alembic import op

revision = "0004_pptmon"
down_revision = "0003_vtap"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pptmon_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=32), nullable=False),
        sa.Column("chain", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("vnf_ns", sa.String(length=64), nullable=False),
        sa.Column("placement", sa.String(length=16), nullable=False),
        sa.Column("sink_vnf", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("flags", sa.Integer(), nullable=False),
        sa.Column("ktime_ns", sa.BigInteger(), nullable=False),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("vnfs", sa.String(length=64), nullable=False),
        sa.Column("hops", sa.JSON(), nullable=False),
        sa.Column("e2e_us", sa.Integer(), nullable=True),
        sa.Column("flow", sa.JSON(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pptmon_records")),
        sa.UniqueConstraint("key", name=op.f("uq_pptmon_records_key")),
        sqlite_autoincrement=True)
    op.create_index("ix_pptmon_records_chain_time", "pptmon_records", ["chain", "time_ns"], unique=False)
    op.create_index(op.f("ix_pptmon_records_time_ns"), "pptmon_records", ["time_ns"], unique=False)


def downgrade() -> None:
    op.drop_table("pptmon_records")

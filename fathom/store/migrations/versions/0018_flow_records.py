"""Flow records: sampling rates per project and port.

Revision ID: 0018_flow_records
Revises: 0015_cluster
"""
import sqlalchemy as sa
from alembic import op

revision = "0018_flow_records"
down_revision = "0017_request_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flow_sampling",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("scope", sa.String(80), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("port_id", sa.Integer(), nullable=True),
        sa.Column("ingress", sa.Integer(), nullable=False),
        sa.Column("admit", sa.Integer(), nullable=False),
        sa.Column("drop", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["port_id"], ["ports.id"], name=op.f("fk_flow_sampling_port_id_ports"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_flow_sampling")),
        sa.UniqueConstraint("scope", name=op.f("uq_flow_sampling_scope")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_flow_sampling_project_id"), "flow_sampling", ["project_id"])
    op.create_index(op.f("ix_flow_sampling_port_id"), "flow_sampling", ["port_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_flow_sampling_port_id"), table_name="flow_sampling")
    op.drop_index(op.f("ix_flow_sampling_project_id"), table_name="flow_sampling")
    op.drop_table("flow_sampling")

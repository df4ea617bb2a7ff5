"""PPTMon on port chains: a chain's `pptmon` parameters, and the chain a stored record belongs to.

Revision ID: 0013_ppt
Revises: 0009_neutron
"""
import sqlalchemy as sa
from alembic import op

revision = "0013_ppt"
down_revision = "0012_dhcp"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sfc_port_chains", sa.Column("pptmon", sa.JSON(), nullable=True))
    # no foreign key: a chain's records outlive it (retention removes them)
    op.add_column("pptmon_records", sa.Column("port_chain_id", sa.Integer(), nullable=True))
    op.create_index(op.f("ix_pptmon_records_port_chain_id"), "pptmon_records", ["port_chain_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_pptmon_records_port_chain_id"), table_name="pptmon_records")
    op.drop_column("pptmon_records", "port_chain_id")
    op.drop_column("sfc_port_chains", "pptmon")

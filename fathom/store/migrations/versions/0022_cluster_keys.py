"""The cluster's shared keys: one row a purpose, made by the first replica that needs it. The LLDP
probes' key is one: a probe sent through a br-phy by its master verifies on whichever replica masters
the fabric switch that receives it.

Revision ID: 0022_cluster_keys
Revises: 0021_port_single_column_indexes
"""
import sqlalchemy as sa
from alembic import op

revision = "0022_cluster_keys"
down_revision = "0021_port_single_column_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_keys",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("key", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cluster_keys")

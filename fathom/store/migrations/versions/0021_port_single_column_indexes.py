"""Ports: the indexes of network_id and of node_id alone dropped. The unique constraints (network_id,
mac_address) and (node_id, interface_name) lead with those columns and serve the same lookups; a
port's creation no longer updates two more indexes, and its check of the interface cannot be planned
on node_id alone (a scan of the node's ports, where the statistics of a young table say it has few).

Revision ID: 0021_port_single_column_indexes
Revises: 0020_flow_record_export
"""
from alembic import op

revision = "0021_port_single_column_indexes"
down_revision = "0020_flow_record_export"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_ports_network_id", table_name="ports")
    op.drop_index("ix_ports_node_id", table_name="ports")


def downgrade() -> None:
    op.create_index("ix_ports_node_id", "ports", ["node_id"])
    op.create_index("ix_ports_network_id", "ports", ["network_id"])

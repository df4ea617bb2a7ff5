"""The start of networking-fathom's contract branch (nothing to contract yet).

Revision ID: f47a0c0001
Revises: fathom_start
"""
from neutron.db.migration import cli

revision = "f47a0c0001"
down_revision = "fathom_start"
branch_labels = (cli.CONTRACT_BRANCH,)


def upgrade():
    pass

"""The root of networking-fathom's migrations.

Revision ID: fathom_start
Revises: None
"""
revision = "fathom_start"
down_revision = None


def upgrade():
    pass

"""Security groups, their rules, ports' memberships and each project's default group.

Revision ID: 0007_secgroups
Revises: 0006_agent
"""
import sqlalchemy as sa
from alembic import op

revision = "0007_secgroups"
down_revision = "0006_agent"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "security_groups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("description", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_security_groups")),
        sqlite_autoincrement=True)
    op.create_index(op.f("ix_security_groups_project_id"), "security_groups", ["project_id"], unique=False)
    op.create_table(
        "security_group_rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("direction", sa.String(length=16), nullable=False),
        sa.Column("ethertype", sa.String(length=8), nullable=False),
        sa.Column("protocol", sa.Integer(), nullable=True),
        sa.Column("port_range_min", sa.Integer(), nullable=True),
        sa.Column("port_range_max", sa.Integer(), nullable=True),
        sa.Column("remote_ip_prefix", sa.String(length=64), nullable=True),
        sa.Column("remote_group_id", sa.Integer(), nullable=True),
        sa.Column("description", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["security_groups.id"], ondelete="CASCADE",
                                name=op.f("fk_security_group_rules_group_id_security_groups")),
        sa.ForeignKeyConstraint(["remote_group_id"], ["security_groups.id"], ondelete="CASCADE",
                                name=op.f("fk_security_group_rules_remote_group_id_security_groups")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_security_group_rules")),
        sqlite_autoincrement=True)
    for column in ("project_id", "group_id", "remote_group_id"):
        op.create_index(op.f(f"ix_security_group_rules_{column}"), "security_group_rules", [column], unique=False)
    op.create_table(
        "port_security_groups",
        sa.Column("port_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["port_id"], ["ports.id"], ondelete="CASCADE",
                                name=op.f("fk_port_security_groups_port_id_ports")),
        sa.ForeignKeyConstraint(["group_id"], ["security_groups.id"], ondelete="RESTRICT",
                                name=op.f("fk_port_security_groups_group_id_security_groups")),
        sa.PrimaryKeyConstraint("port_id", "group_id", name=op.f("pk_port_security_groups")))
    op.create_index(op.f("ix_port_security_groups_group_id"), "port_security_groups", ["group_id"], unique=False)
    op.create_table(
        "default_security_groups",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["security_groups.id"], ondelete="CASCADE",
                                name=op.f("fk_default_security_groups_group_id_security_groups")),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_default_security_groups")),
        sa.UniqueConstraint("group_id", name=op.f("uq_default_security_groups_group_id")))
    _existing_ports_join_their_default_group()


# Neutron's default group: egress to anywhere, ingress from members of the group, IPv4 and IPv6.
DEFAULT_RULES = [("egress", "IPv4", False), ("egress", "IPv6", False), ("ingress", "IPv4", True),
                 ("ingress", "IPv6", True)]


def _existing_ports_join_their_default_group() -> None:
    """Ports made before security groups existed keep their traffic as a port made now would:
    each project with ports gets its default group, and its ports with port security join it."""
    bind = op.get_bind()
    now = sa.func.now() if bind.dialect.name == "postgresql" else sa.text("CURRENT_TIMESTAMP")
    ports = bind.execute(sa.text("SELECT id, project_id FROM ports WHERE router_id IS NULL "
                                 "AND port_security")).all()
    projects = sorted({project for _, project in ports})
    for project in projects:
        group = bind.execute(sa.text(
            "INSERT INTO security_groups (name, project_id, status, created_at, description) "
            "VALUES ('default', :p, 'pending', " + str(now) + ", 'Default security group') RETURNING id"),
            {"p": project}).scalar_one()
        bind.execute(sa.text("INSERT INTO default_security_groups (project_id, group_id) VALUES (:p, :g)"),
                     {"p": project, "g": group})
        for direction, ethertype, from_members in DEFAULT_RULES:
            bind.execute(sa.text(
                "INSERT INTO security_group_rules (project_id, group_id, direction, ethertype, remote_group_id, "
                "description, created_at) VALUES (:p, :g, :d, :e, :r, '', " + str(now) + ")"),
                {"p": project, "g": group, "d": direction, "e": ethertype, "r": group if from_members else None})
        for port_id, port_project in ports:
            if port_project == project:
                bind.execute(sa.text("INSERT INTO port_security_groups (port_id, group_id) VALUES (:i, :g)"),
                             {"i": port_id, "g": group})


def downgrade() -> None:
    op.drop_table("default_security_groups")
    op.drop_table("port_security_groups")
    op.drop_table("security_group_rules")
    op.drop_table("security_groups")

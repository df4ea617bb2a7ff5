"""Create Neutron's schema (and the driver's journal table) in a new SQLite file, for tests and labs.

Neutron's migrations do not run on SQLite (they ALTER constraints), so the tables are created from
the models and the database is then stamped at the migration heads, as Neutron's own tests do. The
one row-writing migration that matters here is replayed: the templates of a new security group's
rules (egress anywhere; in a project's default group also ingress from its members), without which
Neutron's groups would have no rules at all:

    .venv-neutron/bin/python networking-fathom/tools/sqlite_schema.py /path/neutron.db neutron.conf ml2_conf.ini
"""
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa


def main(db: str, *config_files: str) -> None:
    from neutron.db.migration.models import head          # every Neutron model

    import networking_fathom.db                             # noqa: F401  the journal table
    from neutron_taas.db import taas_db, tap_mirror_db       # noqa: F401  TaaS's tables
    from networking_sfc.db import flowclassifier_db, sfc_db  # noqa: F401  networking-sfc's tables
    engine = sa.create_engine(f"sqlite:///{Path(db).absolute()}")
    head.get_metadata().create_all(engine)
    _default_rule_templates(engine)
    engine.dispose()
    manage = Path(sys.executable).with_name("neutron-db-manage")
    args = [str(manage)] + [a for f in config_files for a in ("--config-file", f)] + ["stamp", "heads"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def _default_rule_templates(engine) -> None:
    """The rows Neutron's migration c33da356b165 (security group default rules) writes."""
    from neutron.db.models import securitygroup_default_rules as sg_models
    from oslo_utils import uuidutils
    from sqlalchemy import orm
    with orm.Session(engine) as session, session.begin():
        for direction, ethertype, default_only in (("egress", "IPv4", False), ("egress", "IPv6", False),
                                                   ("ingress", "IPv4", True), ("ingress", "IPv6", True)):
            session.add(sg_models.SecurityGroupDefaultRule(
                id=uuidutils.generate_uuid(), direction=direction, ethertype=ethertype,
                remote_group_id="PARENT" if default_only else None, used_in_default_sg=True,
                used_in_non_default_sg=not default_only,
                description=f"Legacy default SG rule for {direction} traffic"))


if __name__ == "__main__":
    main(*sys.argv[1:])

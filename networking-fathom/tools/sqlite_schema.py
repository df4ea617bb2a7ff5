"""Create Neutron's schema (and the driver's journal table) in a new SQLite file, for tests and labs.

Neutron's migrations do not run on SQLite (they ALTER constraints), so the tables are created from
the models and the database is then stamped at the migration heads, as Neutron's own tests do:

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
    engine = sa.create_engine(f"sqlite:///{Path(db).absolute()}")
    head.get_metadata().create_all(engine)
    engine.dispose()
    manage = Path(sys.executable).with_name("neutron-db-manage")
    args = [str(manage)] + [a for f in config_files for a in ("--config-file", f)] + ["stamp", "heads"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main(*sys.argv[1:])

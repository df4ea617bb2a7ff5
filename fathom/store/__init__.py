"""The store: SQLAlchemy models, migrations, snapshots for the compilers, status updates."""

"""`fathom controller --cluster` on SQLite is refused before it listens, saying why and what to do."""
from click.testing import CliRunner

from fathom.cli.controller import controller


def test_a_cluster_on_sqlite_is_refused_with_a_clear_message(tmp_path):
    out = CliRunner().invoke(controller, ["--cluster", "--db", f"sqlite:///{tmp_path}/f.db", "--insecure",
                                          "--state-dir", str(tmp_path), "--api-port", "1", "--of-port", "1"])
    assert out.exit_code == 2, out.output
    assert "a cluster of controllers needs PostgreSQL" in out.output and "sqlite" in out.output
    assert not (tmp_path / "admin-token").exists()

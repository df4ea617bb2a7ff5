"""What the long-lived processes load: each module a process imports stays in its memory for good,
so the node agent and the controller load only what they run. Each check runs in a fresh
interpreter."""
import json
import subprocess
import sys

import pytest

from fathom.store.db import current_revision, head_revision, make_engine, open_store


def loaded(code: str, modules: list[str]) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {modules!r}}}))"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_agent_loads_no_api_server_store_or_models():
    code = ("import fathom.cli.main, fathom.cli.agent, fathom.agent.agent, fathom.agent.follow, "
            "fathom.agent.local, fathom.agent.routers, fathom.agent.pptmon, fathom.agent.dhcp")
    got = loaded(code, ["sqlalchemy", "fastapi", "uvicorn", "pydantic", "httpx", "alembic", "os_ken", "ovs"])
    assert not any(got.values()), got


def test_the_controller_loads_neither_eventlet_nor_alembic():
    got = loaded("import fathom.controller.server", ["eventlet", "dns", "alembic", "mako", "ovs.poller"])
    assert got == {"eventlet": False, "dns": False, "alembic": False, "mako": False, "ovs.poller": True}


def test_python_ovs_still_works_and_eventlet_stays_importable():
    got = loaded("import fathom.controller.bootstrap, ovs.poller\n"
                 "assert ovs.poller.eventlet_patcher is None\nimport eventlet", ["eventlet"])
    assert got == {"eventlet": True}


def test_the_head_read_from_the_scripts_is_alembics(tmp_path):
    from alembic.script import ScriptDirectory

    from fathom.store.db import alembic_config
    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()
    engine = open_store(f"sqlite:///{tmp_path / 'in.db'}")
    assert current_revision(engine) == head_revision()


@pytest.mark.parametrize("existing", [False, True])
def test_a_store_opened_apart_is_migrated_without_alembic_in_the_process(tmp_path, existing):
    url = f"sqlite:///{tmp_path / 'apart.db'}"
    if existing:
        open_store(url)
    got = loaded(f"from fathom.store.db import open_store\nopen_store({url!r}, migrate_apart=True)", ["alembic"])
    assert got == {"alembic": False}
    assert current_revision(make_engine(url)) == head_revision()


def test_a_store_behind_is_brought_to_the_head_apart(tmp_path):
    from fathom.store.db import migrate
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(make_engine(url), "0005_tokens")
    open_store(url, migrate_apart=True)
    assert current_revision(make_engine(url)) == head_revision()

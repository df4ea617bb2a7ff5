"""The API app over a real store, called in-process (no HTTP) as an admin: what the scripts that
time one kind of API call as the store grows (docs/benchmarks/scale/lists, tap-create, tap-show)
drive. The garbage collector's thresholds are the controller's (GC_THRESHOLDS)."""
from __future__ import annotations

import gc
import warnings

from sqlalchemy import event

from fathom.api import create_app
from fathom.auth.client import bearer
from fathom.auth.tokens import issue_now
from fathom.controller.reconciler import GC_THRESHOLDS


def admin_client(url: str):
    """(an HTTP client of the app over the store at `url`, the list every SQL statement the app
    runs is appended to)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    gc.set_threshold(*GC_THRESHOLDS)
    app = create_app(url)
    http = TestClient(app, headers=bearer(issue_now(app.state.engine, project="admin", roles=["admin"])))
    statements: list[str] = []
    event.listen(app.state.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    return http, statements

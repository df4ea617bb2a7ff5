# measurement only (docs/benchmarks/ovn-compare/cluster/followers): in every `fathom controller` process,
# a line per event in $FOLLOWERS_LOG/<pid>.log, times in seconds of the host's monotonic clock (perf_counter, one
# clock for every process):
#  {"req": [entry, write_out, hop_back, answered]}  each POST /v1/ports: its arrival at the outermost
#      middleware, its store write's end (in the executor's thread), the event loop's resumption, the answer's head;
#   "w": {write_in, first_sql, sql, commit_at, commit_cpu, committed, committed_cpu, cpu}  its store write's start,
#      first SQL statement, the statements' own time (s), the commit's start (SQLAlchemy's "commit" event), its end
#      (the Session's "after_commit") and the writing thread's CPU (s) in the write up to each and in all
#  {"act": kind, "t": [start, end], "cpu": thread CPU ms, "what": ...}  work in the process's other threads and
#      event loop (uvloop: its callbacks cannot be timed one by one): the change feed's notifications
#      (feed_change, feed_status), reconciler passes (pass: its triggers, the tokens it read for, the store's parts
#      it read whole, the port rows it read again, its steps in ms),
#      a replica's decision whether a write wakes its pass (wakes_for), and every other HTTP request (http, arrival to end)
import os, sys, time
if "controller" in " ".join(sys.argv) and os.environ.get("FOLLOWERS_LOG"):
    import contextvars, json, threading
    REQ = contextvars.ContextVar("followers_req", default=None)
    _lock, _out = threading.Lock(), []

    def out(record):
        with _lock:
            if not _out:
                os.makedirs(os.environ["FOLLOWERS_LOG"], exist_ok=True)
                _out.append(open(f"{os.environ['FOLLOWERS_LOG']}/{os.getpid()}.log", "a", buffering=1))
                _out[0].write(json.dumps({"argv": " ".join(sys.argv)}) + "\n")
            _out[0].write(json.dumps(record) + "\n")

    def timed(owner, attr, kind, what=None):
        orig = getattr(owner, attr)

        def wrapped(*a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                out({"act": kind, "t": [t0, time.perf_counter()], "cpu": round((time.thread_time() - c0) * 1000, 4),
                     "what": what(*a) if what else None})
        setattr(owner, attr, wrapped)

    def patch_server(mod):
        orig = mod.DateHeader.__call__

        async def call(self, scope, receive, send):
            if scope["type"] != "http":
                return await orig(self, scope, receive, send)
            if scope["method"] != "POST" or scope["path"] != "/v1/ports":
                t0 = time.perf_counter()
                try:
                    return await orig(self, scope, receive, send)
                finally:
                    out({"act": "http", "t": [t0, time.perf_counter()], "cpu": None,
                         "what": f"{scope['method']} {scope['path']}"})
            marks = {"entry": time.perf_counter()}
            REQ.set(marks)

            async def sent(message):
                if message["type"] == "http.response.start":
                    marks["answered"] = time.perf_counter()
                await send(message)
            try:
                return await orig(self, scope, receive, sent)
            finally:
                out({"req": [marks.get(k) for k in ("entry", "write_out", "hop_back", "answered")],
                     "w": {k: marks.get(k) for k in ("write_in", "first_sql", "sql", "commit_at", "commit_cpu", "committed",
                                                     "committed_cpu", "cpu")}})
        mod.DateHeader.__call__ = call

    def patch_handoff(mod):
        orig = mod.in_thread

        async def in_thread(fn, *a, **k):
            try:
                return await orig(fn, *a, **k)
            finally:
                m = REQ.get()
                if m is not None and "write_out" in m and "hop_back" not in m:
                    m["hop_back"] = time.perf_counter()
        mod.in_thread = in_thread

    def patch_deps(mod):
        orig = mod.Store.write

        def write(*a, **k):
            m = REQ.get()
            if m is not None:
                m["write_in"], m["sql"], c0 = time.perf_counter(), 0.0, time.thread_time()
                m["_c0"] = c0
            try:
                return orig(*a, **k)
            finally:
                if m is not None:
                    m["write_out"] = time.perf_counter()
                    m["cpu"] = time.thread_time() - c0
        mod.Store.write = write

    def patch_reconciler(mod):
        take = mod.Reconciler._take_events

        def _take_events(self):
            ev = take(self)
            self._followers_triggers = sorted(ev.triggers)
            self._followers_reads = dict(self.store.reader.reads), self.store.reader.rows_read
            return ev
        mod.Reconciler._take_events = _take_events
        timed(mod.Reconciler, "run_pass", "pass", lambda s, *a, **k: {
            "triggers": getattr(s, "_followers_triggers", None),
            "read_for": None if s.store.written is None else sorted(map(str, s.store.written))[:12],
            "parts_read": sorted(k for k, v in s.store.reader.reads.items() if v != s._followers_reads[0].get(k)),
            "rows_read": s.store.reader.rows_read - s._followers_reads[1],
            **{x: round(v * 1000, 3) for x, v in (s.last_pass_steps or {}).items()}})

    def patch_feed(mod):
        timed(mod.Listener, "_statuses", "feed_status", lambda s, text: text[:300])
        timed(mod.Listener, "_received", "feed_change", lambda s, text: text[:120])

    def patch_sqla(mod):
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        @event.listens_for(Engine, "before_cursor_execute")
        def before(conn, cursor, statement, parameters, context, executemany):
            m = REQ.get()
            if m is not None and "write_in" in m:
                m.setdefault("first_sql", time.perf_counter())
                m["_sql0"] = time.perf_counter()

        @event.listens_for(Engine, "after_cursor_execute")
        def after(conn, cursor, statement, parameters, context, executemany):
            m = REQ.get()
            if m is not None and "_sql0" in m:
                m["sql"] += time.perf_counter() - m.pop("_sql0")

        def mark(at, cpu):
            m = REQ.get()
            if m is not None and "write_in" in m:
                m[at], m[cpu] = time.perf_counter(), time.thread_time() - m["_c0"]

        from sqlalchemy.orm import Session
        event.listen(Engine, "commit", lambda conn: mark("commit_at", "commit_cpu"))
        event.listen(Session, "after_commit", lambda session: mark("committed", "committed_cpu"))

    PATCH = {
        "fathom.store.db": patch_sqla,
        "fathom.controller.server": patch_server,
        "fathom.api.handoff": patch_handoff,
        "fathom.api.deps": patch_deps,
        "fathom.cluster.feed": patch_feed,
        "fathom.controller.reconciler": patch_reconciler,
        "fathom.controller.cluster": lambda m: timed(m.ClusterMember, "wakes_for", "wakes_for"),
    }

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from patch_on_import import install
    install(PATCH)

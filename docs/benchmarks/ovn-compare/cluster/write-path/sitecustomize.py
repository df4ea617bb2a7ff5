# measurement only (docs/benchmarks/ovn-compare/cluster/write-path): in every `fathom controller`
# process, for each POST /v1/ports, the wall and thread CPU time (ms from the request's arrival at the
# API's outermost middleware) at each step of its store write, a line per request in $WRITE_PATH_LOG/<pid>.log
import os, sys, time
if "controller" in " ".join(sys.argv) and os.environ.get("WRITE_PATH_LOG"):
    import contextvars, json
    MARKS = contextvars.ContextVar("write_path_marks", default=None)
    _out = []

    def out(record):
        if not _out:
            os.makedirs(os.environ["WRITE_PATH_LOG"], exist_ok=True)
            _out.append(open(f"{os.environ['WRITE_PATH_LOG']}/{os.getpid()}.log", "a", buffering=1))
            _out[0].write(json.dumps({"argv": " ".join(sys.argv)}) + "\n")
        _out[0].write(json.dumps(record) + "\n")

    def mark(name):
        m = MARKS.get()
        if m is not None:
            m.append((name, time.perf_counter(), time.thread_time()))

    def wrap(owner, attr, before, after):
        orig = getattr(owner, attr)

        def wrapped(*a, **k):
            mark(before)
            try:
                return orig(*a, **k)
            finally:
                mark(after)
        setattr(owner, attr, wrapped)

    def patch_server(mod):
        orig = mod.DateHeader.__call__

        async def call(self, scope, receive, send):
            if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/v1/ports":
                return await orig(self, scope, receive, send)
            marks = [("entry", time.perf_counter(), 0.0)]
            MARKS.set(marks)

            async def sent(message):
                if message["type"] == "http.response.start":
                    mark("answered")
                await send(message)
            try:
                return await orig(self, scope, receive, sent)
            finally:
                t = marks[0][1]
                out({"at": time.time(), "wall": [[n, round((w - t) * 1000, 4)] for n, w, _ in marks[1:]],
                     "cpu": [[n, round(c * 1000, 4)] for n, _, c in marks[1:]]})
        mod.DateHeader.__call__ = call

    def patch_handoff(mod):
        orig = mod.in_thread

        async def in_thread(fn, *a, **k):
            mark("hop")
            try:
                return await orig(fn, *a, **k)
            finally:
                mark("hop_back")
        mod.in_thread = in_thread

    PATCH = {
        "fathom.controller.server": patch_server,
        "fathom.api.handoff": patch_handoff,
        "fathom.api.deps": lambda m: wrap(m.Store, "write", "write_in", "write_out"),
        "fathom.store.ops": lambda m: (wrap(m, "new_port", "checks_in", "checks_out"),
                                       wrap(m, "insert_port", "insert_in", "insert_out")),
        "fathom.api.request_ids": lambda m: wrap(m, "claim", "key_in", "key_out"),
        "fathom.cluster.feed": lambda m: wrap(m._Notes, "_committed_on", "notify_in", "notify_out"),
        "sqlalchemy.engine.default": lambda m: wrap(m.DefaultDialect, "do_commit", "commit_in", "commit_out"),
        "fathom.controller.reconciler": lambda m: wrap(m.Reconciler, "wake", "wake_in", "wake_out"),
    }

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from patch_on_import import install
    install(PATCH)

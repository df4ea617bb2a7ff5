# measurement only (docs/benchmarks/ovn-compare/cluster/priorities): the GIL switch interval from FATHOM_W9_SWITCH (seconds), and a line per controller process in /tmp/w9/sc.log
import os, sys
_v = os.environ.get("FATHOM_W9_SWITCH")
if _v:
    sys.setswitchinterval(float(_v))
if "controller" in " ".join(sys.argv):
    os.makedirs("/tmp/w9", exist_ok=True)
    with open("/tmp/w9/sc.log", "a") as f:
        f.write(f"{os.getpid()} {sys.getswitchinterval()} {os.environ.get('PYTHONPATH')} {' '.join(sys.argv)[:120]}\n")

# upper bounds (measurement only): a replica that masters the br-int of none of the nodes FATHOM_W9_NODES names (default c1)
# runs its passes at nice FATHOM_W9_NICE (its whole process with FATHOM_W9_ALL), and with FATHOM_W9_DELAY (seconds) starts a
# pass woken by store writes alone that much later
_n = os.environ.get("FATHOM_W9_NICE")
if _n and "controller" in " ".join(sys.argv):
    import importlib.abc, threading, time
    def _patch():
        from fathom.controller import reconciler as r
        from fathom.apps import BR_INT, SwitchKey
        orig = r.Reconciler.run_pass
        def run_pass(self, *a, **k):
            want, other = 0, False
            if self.cluster is not None:
                from fathom.model import datapath_id
                names = (os.environ.get("FATHOM_W9_NODES") or "c1").split(",")
                nodes = [n for n in (self.model.nodes if self.model else ()) if n.name in names]
                if len(nodes) == len(names) and not any(self.cluster.masters(datapath_id(n.id)) for n in nodes):
                    want, other = int(_n), True
            if getattr(self, "_w9_nice", 0) != want:
                tids = [int(t) for t in os.listdir("/proc/self/task")] if os.environ.get("FATHOM_W9_ALL") else [threading.get_native_id()]
                for t in tids:
                    try:
                        os.setpriority(os.PRIO_PROCESS, t, want)
                    except OSError:
                        pass
                self._w9_nice = want
                with open("/tmp/w9/nice.log", "a") as f:
                    f.write(f"{os.getpid()} {threading.get_native_id()} nice {want}\n")
            elif self.passes in (0, 30, 200):
                with open("/tmp/w9/nice.log", "a") as f:
                    f.write(f"{os.getpid()} first pass cluster={self.cluster is not None} keys={list(self.results)[:6]}\n")
            delay = float(os.environ.get("FATHOM_W9_DELAY") or 0)
            if delay and other:
                with self._events_lock:
                    store_only = not (self._events.triggers - {"api", "feed"}) and self._events.store
                if store_only:
                    time.sleep(delay)
            return orig(self, *a, **k)
        r.Reconciler.run_pass = run_pass
    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "fathom.controller.reconciler":
                sys.meta_path.remove(self)
                import importlib.util
                spec = importlib.util.find_spec(name)
                loader = spec.loader
                orig_exec = loader.exec_module
                def exec_module(module):
                    orig_exec(module)
                    _patch()
                loader.exec_module = exec_module
                return spec
            return None
    sys.meta_path.insert(0, _Finder())

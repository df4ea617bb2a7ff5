"""costs.py: two costs of this machine that the master's commit pays, JSON on stdout (run as root from the repository,
`.venv/bin/python docs/benchmarks/ovn-compare/cluster/followers/pg-inside/costs.py`):
  kill_us          a kill(SIGUSR1) to each of three processes asleep in select() (as idle PostgreSQL backends wait), µs
                   a signal, median of 2,000 rounds
  select_1_cpu_us  the calling thread's CPU (thread_time: its own and the kernel's work for it) for one `SELECT 1`
                   through psycopg on a throw-away PostgreSQL over its unix socket, median of 1,000"""
import json
import os
import select
import signal
import statistics
import sys
import time

from fathom.bench.postgres import PORT, PostgresServer


def kill_us(sleepers: int = 3, rounds: int = 2000) -> float:
    kids = []
    for _ in range(sleepers):
        r, _w = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGUSR1, lambda *_: None)
            while True:
                try:
                    select.select([r], [], [])
                except InterruptedError:
                    pass
        kids.append(pid)
    time.sleep(0.5)
    each = []
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            for kid in kids:
                os.kill(kid, signal.SIGUSR1)
            each.append((time.perf_counter() - t) / sleepers)
            time.sleep(0.002)       # they are asleep again before the next round
    finally:
        for kid in kids:
            os.kill(kid, signal.SIGKILL)
            os.waitpid(kid, 0)
    return round(statistics.median(each) * 1e6, 1)


def select_1_cpu_us(n: int = 1000) -> float:
    import psycopg
    server = PostgresServer().start()
    try:
        with psycopg.connect(host=str(server.socket_dir), port=PORT, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            cpu = []
            for _ in range(n):
                t = time.thread_time()
                conn.execute("SELECT 1").fetchone()
                cpu.append(time.thread_time() - t)
        return round(statistics.median(cpu[100:]) * 1e6, 1)
    finally:
        server.stop()


json.dump({"kill_us": kill_us(), "select_1_cpu_us": select_1_cpu_us(),
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sys.stdout, indent=1)
print()

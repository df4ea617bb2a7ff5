"""A node agent's desired-state long-poll running in a thread for the length of a `with` block, as
the agent's own loop runs it: it picks up and answers the requests on the controller's desks."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager


@contextmanager
def agent_polling(follower):
    """`follower` (fathom.agent.follow.Follower) fetching in a thread; its first fetch done and its
    long-poll held before the block starts."""
    follower.fetch(0.0)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            follower.fetch(1.0)
    t = threading.Thread(target=loop)
    t.start()
    try:
        time.sleep(0.3)
        yield
    finally:
        stop.set()
        t.join()

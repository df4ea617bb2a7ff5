"""The status board's long-polls: woken only by the publish that answers them."""
from __future__ import annotations

import asyncio
import threading

from fathom.controller.board import StatusBoard

PORT = ("port", 1)


def _publish_from_thread(board: StatusBoard, publishes: list[tuple[dict, int]]) -> None:
    """As the reconciler does: from a thread of its own."""
    def run():
        for statuses, covered in publishes:
            board.publish(statuses, covered)
    t = threading.Thread(target=run)
    t.start()
    t.join()


def test_only_the_publish_that_answers_a_long_poll_wakes_it():
    board = StatusBoard()

    async def main():
        need = board.request()                 # the caller's own write
        waiting = asyncio.ensure_future(board.wait((PORT,), "active", timeout=10))
        await asyncio.sleep(0.05)
        # its status from before the write, then other objects' statuses and this port's others
        _publish_from_thread(board, [({PORT: ("active", None)}, need - 1)] * 10
                             + [({("port", 2): ("active", None), PORT: ("down", "no VIF")}, need)] * 50)
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert board.woken == 0
        _publish_from_thread(board, [({PORT: ("active", None), ("port", 2): ("down", None)}, need)])
        assert await asyncio.wait_for(waiting, 5) == ("active", None)
        assert board.woken == 1
    asyncio.run(main())


def test_an_error_answers_and_an_overtaken_answer_waits_on():
    board = StatusBoard()

    async def main():
        need = board.request()
        first = asyncio.ensure_future(board.wait((("router_interface", 1), PORT), "active", timeout=0.5))
        await asyncio.sleep(0.05)
        # answered, then overtaken before the long-poll's loop ran: it must not answer "active"
        # from a board that no longer says so
        board.publish({PORT: ("active", None)}, need)
        board.publish({PORT: ("down", "unplugged")}, need)
        assert await asyncio.wait_for(first, 5) is None        # its timeout, not a stale answer
        second = asyncio.ensure_future(board.wait((PORT,), "active", timeout=10))
        await asyncio.sleep(0.05)
        _publish_from_thread(board, [({PORT: ("error", "refused by compute1")}, need)])
        assert await asyncio.wait_for(second, 5) == ("error", "refused by compute1")
    asyncio.run(main())


def test_a_status_already_there_answers_without_waiting():
    board = StatusBoard()
    need = board.request()
    board.publish({PORT: ("active", None)}, need)

    async def main():
        return await asyncio.wait_for(board.wait((PORT,), "active", timeout=10), 1)
    assert asyncio.run(main()) == ("active", None)
    assert board.woken == 0

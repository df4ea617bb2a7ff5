"""Read your own writes across processes: the `X-Fathom-Commit` header.

Where several processes take writes (the replicas of a cluster, a controller's API workers), each
write notifies the change feed in its transaction (fathom.cluster.feed.notify_commits), and its
answer carries that transaction's id: `X-Fathom-Commit: <id>`. A client sends the last id it was
given back with a long-poll (`GET ...?wait=`), in the same header, wherever that long-poll lands:
it is answered only by statuses decided from a read that had that write (StatusBoard.answer). A
process that takes every write itself (one controller) sends no such header and needs none.
"""
from __future__ import annotations

from fastapi import Request

from fathom.store.errors import Invalid
from fathom.cluster.feed import REQUEST_COMMITS

HEADER = "X-Fathom-Commit"
_HEADER = HEADER.lower().encode()
_DIGITS = 19      # PostgreSQL's transaction ids (xid8) below 2**63


class CommitHeader:
    """ASGI middleware of the API: a write's answer (2xx) names the transaction its last
    notifying write committed in."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "GET":
            return await self.app(scope, receive, send)
        commits: list = []
        token = REQUEST_COMMITS.set(commits)

        async def named(message):
            if message["type"] == "http.response.start" and commits and message["status"] < 300:
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (_HEADER, str(commits[-1]).encode())]}
            await send(message)
        try:
            return await self.app(scope, receive, named)
        finally:
            REQUEST_COMMITS.reset(token)


def after_commit(request: Request) -> int | None:
    """The transaction id a long-poll must see (its `X-Fathom-Commit`), None when not sent."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > _DIGITS:
        raise Invalid(f"{HEADER} must be a transaction id (digits) as a write's answer gave it", HEADER)
    return int(raw)

"""The edge's one admission point (ASGI middleware): readiness, the concurrency cap, the count.

Every route family (v2 generate, the v2 proxy, OpenAI) passes here, so one
`--max-concurrent-requests` caps them together and the shutdown drain waits on one count. A
request counts until its last body chunk is about to be sent (a stream until it ends).
"""

from __future__ import annotations

from bucketserve.serving.front.errors import refuse
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics

# answered whatever the server's state (they report it), never counted or capped
ALWAYS = frozenset({"/v2/health/ready", "/v2/health/live", "/health", "/metrics", "/v1/models"})


class Admission:
    """Wraps the edge's app; `limit` POSTs in flight at most (0: no cap)."""

    def __init__(self, app, health: Health, metrics: FrontMetrics, limit: int = 0) -> None:
        self.app, self.health, self.metrics = app, health, metrics
        self.limit = limit
        self.active = 0  # requests being answered now, any method
        self.posts = 0  # of which POSTs (inference), what the cap counts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in ALWAYS:
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is not None:
            return await refusal(scope, receive, send)
        is_post = scope["method"] == "POST"
        self.active += 1
        self.posts += is_post
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.active -= 1
                self.posts -= is_post

        async def counted(message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                release()  # before the last chunk goes out: a client that saw it sees 0
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            release()

    def refusal(self, scope):
        """The answer to give instead of serving this request, or None."""
        path = scope["path"]
        if not self.health.is_ready:
            self.metrics.rejected.labels("not_ready").inc()
            return refuse(path, 503, f"server unavailable: {self.health.cause}; retry", True)
        if scope["method"] == "POST" and 0 < self.limit <= self.posts:
            # Before Triton: a busy answer from the scheduler comes only after the request
            # went through Triton and tokenization (16 s at the 90th percentile under 2x load),
            # and every request Triton holds costs memory there and in the stubs.
            self.metrics.rejected.labels("concurrency").inc()
            message = (f"server busy: {self.posts} requests in flight"
                       f" (max_concurrent_requests={self.limit}); retry")  # fmt: skip
            return refuse(path, 503, message, True)
        return None

"""The edge's one admission point (ASGI middleware): access, readiness, the cap, the count.

Every route family (v2 generate, the v2 proxy, OpenAI) passes here, so one
`--max-concurrent-requests` caps them together and the shutdown drain waits on one count. A
request counts until its last body chunk is about to be sent (a stream until it ends).
"""

from __future__ import annotations

from bucketserve.serving.front.allowlist import AccessPolicy
from bucketserve.serving.front.errors import refuse
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics

# answered whatever the server's state (they report it), never counted or capped
ALWAYS = frozenset({"/v2/health/ready", "/v2/health/live", "/health", "/metrics", "/v1/models"})


class Admission:
    """Wraps the edge's app: `policy` says who may use a path (front/allowlist.py); `limit`
    POSTs in flight at most (0: no cap)."""

    def __init__(
        self, app, health: Health, metrics: FrontMetrics, limit: int = 0,
        policy: AccessPolicy | None = None,
    ) -> None:  # fmt: skip
        self.app, self.health, self.metrics = app, health, metrics
        self.limit = limit
        self.policy = policy or AccessPolicy()
        self.active = 0  # requests being answered now, any method
        self.posts = 0  # of which POSTs (inference), what the cap counts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.denial(scope)
        if refusal is None and scope["path"] in ALWAYS:
            return await self.app(scope, receive, send)
        refusal = refusal or self.refusal(scope)
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

    def denial(self, scope):
        """The answer to a request this client may not make (401, 403, 404), or None."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        found = self.policy.check(scope["path"], headers)
        if found is None:
            return None
        self.metrics.rejected.labels(found.reason).inc()
        answer = refuse(scope["path"], found.status, found.message)
        if found.status == 401:
            answer.headers["WWW-Authenticate"] = "Bearer"
        return answer

    def refusal(self, scope):
        """The answer to give instead of serving this request now (not ready, busy), or None."""
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

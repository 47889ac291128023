"""What the embedded server (:mod:`.server`) accepts, and from whom.

* **The API key.** Every request must carry ``Authorization: Bearer <key>``
  (:mod:`.auth`); the one exception is ``GET /health``, the liveness probe that sglang-router
  and load balancers send without credentials. Anything else without the key is answered 401
  before its body is read, so an unauthenticated caller can neither generate, nor load, read or
  receive weights, nor abort requests.
* **The weight-update group's master.** ``/init_weights_update_group`` makes the server connect
  to ``master_address`` and receive tensors from it; a server joins only the configured trainer
  (``rollout.sglang.master_addr``, or ``--trainer-address``; when neither is set, only an
  address of this host, one the server could bind), compared by resolved IP, so even a caller
  holding the key cannot point it at a process of their own.
* **Load.** A request's prompts and tokens are bounded in :mod:`.server_requests`; the queue
  of waiting samples is bounded here, and a request that would overflow it is answered 429
  with ``Retry-After`` (the client backs off and retries).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from megatron_rl.rollout.auth import authorized

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"})  # GET only: liveness, no credentials


def auth_middleware(key: str) -> Middleware:
    """An aiohttp middleware refusing (401) every request without ``key``, but GET /health."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in ("GET", "HEAD") and request.path in OPEN_PATHS:
            return await handler(request)
        if not authorized(request.headers.get("Authorization"), key):
            return web.json_response(
                {"error": {"message": "missing or wrong API key (Authorization: Bearer ...)"}},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return check


def addresses(host: str) -> set[str]:
    """Every IP ``host`` resolves to (empty when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return set()
    return {str(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos}


def is_own(ip: str) -> bool:
    """Whether ``ip`` is an address of this host: only those can be bound to."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
    except OSError:
        return False
    return True


class TrainerCheck:
    """Whether a weight-group ``master_address`` is the configured trainer."""

    def __init__(self, trainer: str = "") -> None:
        self.trainer = trainer  # configured address or host name ('' -> this host)

    def refuse(self, master_address: str) -> str | None:
        """None when ``master_address`` is the trainer, else the reason it is refused."""
        got = addresses(master_address)
        if self.trainer:
            allowed = addresses(self.trainer)
            if got and got <= allowed:
                return None
            who = f"the configured trainer {self.trainer!r} ({sorted(allowed)})"
        else:
            if got and all(is_own(ip) for ip in got):
                return None
            who = "an address of this host (no trainer address configured)"
        return (
            f"master_address {master_address!r} is not {who}; set rollout.sglang.master_addr "
            "(or serve --trainer-address) to the trainer's address"
        )


class QueueBound:
    """Samples waiting for or in the engine, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the server's queue bound must be >= 1, got {limit}")
        self.limit, self.used = limit, 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` samples; False (and nothing taken) when that would overflow."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


def busy(bound: QueueBound, n: int) -> web.Response:
    """400 for a request of ``n`` samples that can never fit the queue, 429 for one that does
    not fit it now."""
    if n > bound.limit:
        return web.json_response(
            {
                "error": {
                    "message": f"the request asks for {n} samples (prompts x n); this server "
                    f"queues at most {bound.limit} (--max-queued): split it"
                }
            },
            status=400,
        )
    return web.json_response(
        {
            "error": {
                "message": f"server busy: {bound.used} samples queued, {n} more would pass the "
                f"bound of {bound.limit} (--max-queued); retry later"
            }
        },
        status=429,
        headers={"Retry-After": "1"},
    )

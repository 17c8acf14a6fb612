"""Who may call an endpoint that is not public: the caller's Kubernetes token, checked by
the registry service (the one part of torchyard that may ask the apiserver: TokenReview
bound to the endpoint's own audience, SubjectAccessReview ``get`` on the endpoint).

The serving Pod holds no credentials of its own: :class:`Access` forwards the caller's
token to the registry's access route and keeps the answer, by the token's sha256 (never
the token), for ``ttl`` seconds when it was a yes and ``denied_ttl`` when it was a no
(bounded: at most ``size`` answers); concurrent requests with one new token make one
question. A registry that cannot be asked answers 503 and nothing is kept. Standard
library only (shipped into user images); called by ``serving.app``; tested in
tests/unit/serving/test_auth.py and, against the real registry service, in
tests/integration/test_endpoints.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping

from torchyard.serving.contract import TOKEN_HEADER

ALLOWED, UNAUTHORIZED, FORBIDDEN, UNAVAILABLE = 200, 401, 403, 503
ASK_TIMEOUT_SECONDS = 5.0

Decision = tuple[int, str]


def token_of(headers: Mapping[str, str]) -> str:
    """``Authorization: Bearer <token>``, else ``X-Torchyard-Token`` (the apiserver's
    service proxy drops ``Authorization``)."""
    header = headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return headers.get(TOKEN_HEADER.lower(), "").strip()


def ask_registry(url: str, ca: str) -> Callable[[str], Decision]:
    """The question to the registry's access route ``url`` (verified with the CA ``ca``,
    PEM, over https), as a function of the token."""
    context = ssl.create_default_context(cadata=ca) if ca.strip() else None

    def ask(token: str) -> Decision:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=ASK_TIMEOUT_SECONDS, context=context):
                return ALLOWED, ""
        except urllib.error.HTTPError as err:
            said = err.read(2048).decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError):
                said = str(json.loads(said).get("error") or said)
            if err.code in (UNAUTHORIZED, FORBIDDEN):
                return err.code, said.strip() or err.reason
            return UNAVAILABLE, f"the registry service answered {err.code} {err.reason}"
        except (urllib.error.URLError, OSError) as err:
            return UNAVAILABLE, f"cannot reach the registry service to check the token: {err}"

    return ask


class Access:
    """The decisions on callers' tokens, cached (see the module docstring)."""

    def __init__(
        self,
        ask: Callable[[str], Decision],
        *,
        ttl: float = 30.0,
        denied_ttl: float = 5.0,
        size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ask = ask
        self.ttl, self.denied_ttl, self.size = ttl, denied_ttl, size
        self.clock = clock
        self._kept: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._asking: dict[str, asyncio.Future[Decision]] = {}

    def _known(self, key: str) -> Decision | None:
        hit = self._kept.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock():
            del self._kept[key]
            return None
        return hit[1]

    def _keep(self, key: str, decision: Decision) -> None:
        if decision[0] == UNAVAILABLE:
            return
        ttl = self.ttl if decision[0] == ALLOWED else self.denied_ttl
        self._kept.pop(key, None)
        self._kept[key] = (self.clock() + ttl, decision)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    async def decide(self, token: str) -> Decision:
        """(status, why) of a request with ``token``: 200, 401, 403 or 503."""
        if not token:
            return UNAUTHORIZED, "a Kubernetes bearer token for this endpoint is required"
        key = hashlib.sha256(token.encode()).hexdigest()
        known = self._known(key)
        if known is not None:
            return known
        asking = self._asking.get(key)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        try:
            decision = await asyncio.get_running_loop().run_in_executor(None, self.ask, token)
            self._keep(key, decision)
            future.set_result(decision)
            return decision
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # (retrieved here: no "never retrieved" warning)
            raise
        finally:
            del self._asking[key]

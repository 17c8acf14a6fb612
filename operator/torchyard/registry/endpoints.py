"""The registry service's answer to a serving Pod: may this caller call this endpoint?

``GET /v1/namespaces/{ns}/endpoints/{name}/access`` with the caller's token (the serving
Pod forwards what it was sent; it holds no credentials of its own): 401 when the token is
missing, not valid, or not bound to OnlineEndpoint ``ns/name``'s own audience
(``wire.endpoint_audience``: a token meant for the apiserver, the registry or another
endpoint does not count); 403 when its user may not ``get`` that endpoint; 200 with the
user's name otherwise. The Authorizer's answers are cached like the others
(``auth.CachingAuthorizer``) and its calls run in the executor. Tested in
tests/unit/registry/test_endpoint_access.py and, against the real apiserver,
tests/integration/test_endpoints.py.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from torchyard.api import wire
from torchyard.registry.access import token
from torchyard.registry.auth import Authorizer


class EndpointAccess:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def check(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        bearer = token(request)
        if not bearer:
            return web.json_response(
                {"error": f"a Kubernetes token for endpoint {ns}/{name} is required"}, status=401
            )
        loop = asyncio.get_running_loop()
        user = await loop.run_in_executor(None, self.authorizer.endpoint_user, bearer, ns, name)
        if user is None:
            return web.json_response(
                {
                    "error": f"the token is not valid for endpoint {ns}/{name}: mint one for its "
                    "audience (kubectl create token <sa> --audience "
                    f"{wire.endpoint_audience(ns, name)})"
                },
                status=401,
            )
        allowed = self.authorizer.endpoint_allowed
        if not await loop.run_in_executor(None, allowed, user, ns, name):
            return web.json_response(
                {"error": f"{user.get('username')} may not get onlineendpoints/{name} in {ns}"},
                status=403,
            )
        return web.json_response({"user": user.get("username")})

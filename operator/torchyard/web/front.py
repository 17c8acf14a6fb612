"""What the web view believes of where a request came from, before anything else reads
it (``torchyard.web.app.guard``): the Host names it answers for, and the proxies whose
``X-Forwarded-Proto`` and ``X-Forwarded-Host`` it honours.

- **Hosts.** A request for a Host name the view was not told about is refused (421), so
  a page of another site cannot reach it by pointing a name of its own at its address
  (DNS rebinding). Names are compared without their port, as Django's ``ALLOWED_HOSTS``
  does; the loopback names are always allowed (``kubectl port-forward``, the view on
  127.0.0.1). ``/healthz`` answers any Host (the kubelet's probe says the Pod's IP).
- **Trusted proxies.** Only a request whose peer address is in one of these networks
  has its forwarded scheme and host believed (the last value of each: the one the
  nearest proxy wrote), so that behind a proxy terminating TLS the token cookie is
  ``Secure`` and the origin checked is the one the browser saw. Anyone else's
  ``X-Forwarded-*`` headers are ignored.

The CLI's ``ui`` options and the chart's ``ui.allowedHosts``/``ui.trustedProxies`` fill
these in. Tested in tests/unit/web/test_front.py.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

from aiohttp import web

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
HOSTS = web.AppKey("hosts", set[str])  # names without port; empty: any
PROXIES = web.AppKey("proxies", tuple[Network, ...])
LOOPBACK = ("localhost", "127.0.0.1", "::1")
UNSPECIFIED = ("0.0.0.0", "::", "")
SCHEMES = ("http", "https")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def host_name(value: str) -> str | None:
    """The name of a Host header value (``Example.org:8080`` -> ``example.org``,
    ``[::1]:80`` -> ``::1``), None when it is none."""
    try:
        parts = urllib.parse.urlsplit(f"//{value}")
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query:
        return None
    return parts.hostname


def allowed_name(value: str) -> str:
    """A host name the view may be asked for (the CLI's ``--allowed-host``): a DNS name
    or an IP address, without a port. Raises ValueError saying why not."""
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if not DNS_NAME.fullmatch(value):
        raise ValueError(f"not a host name or address without a port: {value[:100]!r}")
    return value.lower()


def listening_names(address: str) -> set[str]:
    """The names a view listening on ``address`` always answers for: the loopback names
    and the address itself (unless it is 0.0.0.0 or ::)."""
    return {*LOOPBACK, *(() if address in UNSPECIFIED else (allowed_name(address),))}


def allowed(request: web.Request) -> bool:
    hosts = request.app[HOSTS]
    return not hosts or host_name(request.host) in hosts


def network(value: str) -> Network:
    """A trusted proxy's network (the CLI's ``--trusted-proxy``): ``10.0.0.0/8`` or one
    address. Raises ValueError saying why not."""
    return ipaddress.ip_network(value, strict=False)


def seen(request: web.Request) -> web.Request:
    """The request as the browser made it: from a trusted proxy, with the scheme and host
    that proxy forwarded; from anyone else, as it came."""
    proxies = request.app[PROXIES]
    if not proxies or not _trusted(request.remote, proxies):
        return request
    scheme = _last(request.headers.getall("X-Forwarded-Proto", [])).lower()
    host = _last(request.headers.getall("X-Forwarded-Host", []))
    if scheme in SCHEMES and host:
        return request.clone(scheme=scheme, host=host)
    if scheme in SCHEMES:
        return request.clone(scheme=scheme)
    return request.clone(host=host) if host else request


def _trusted(peer: str | None, proxies: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(peer or "")
    except ValueError:
        return False
    return any(address in net for net in proxies)


def _last(values: list[str]) -> str:
    """The value the nearest proxy wrote: the last of a comma-separated list."""
    return values[-1].rsplit(",", 1)[-1].strip() if values else ""

"""The registry service's TLS: its certificate and key, loaded again when they are renewed.

:class:`TLSFiles` (``torchyard registry serve --tls-cert/--tls-key``) keeps one server
:class:`ssl.SSLContext`; :func:`reloading` is the aiohttp cleanup context that checks the
files every ``interval`` seconds, so a certificate cert-manager renewed is served within
a minute, while a half-written pair leaves the loaded one in place.

Used by ``registry.service.serve``; tested in ``tests/unit/registry/test_tls_and_tokens.py``
and ``tests/integration/test_registry_tls.py``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

logger = logging.getLogger("torchyard.registry")


class TLSFiles:
    """The service's certificate and key (``--tls-cert``/``--tls-key``), loaded into one
    server :class:`ssl.SSLContext` and loaded again when the files change: cert-manager
    renews the Secret and the kubelet swaps the mounted files; new connections get the
    new certificate, open ones keep theirs."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._loaded: tuple[bytes, bytes] = (b"", b"")
        self.refresh()

    def _contents(self) -> tuple[bytes, bytes]:
        try:
            return self.cert.read_bytes(), self.key.read_bytes()
        except OSError as err:
            raise ValueError(f"cannot read the TLS certificate or key: {err}") from None

    def refresh(self) -> bool:
        """Load the files when they differ from what is loaded; True when it did. A pair
        that does not load (half-written by a renewal) raises and leaves the loaded one."""
        contents = self._contents()
        if contents == self._loaded:
            return False
        # One snapshot of both files, checked in a scratch context first: a failed load
        # would leave the live context with a certificate and a key that do not match.
        with tempfile.TemporaryDirectory(prefix="torchyard-tls-") as scratch:
            cert, key = Path(scratch, "tls.crt"), Path(scratch, "tls.key")
            cert.write_bytes(contents[0])
            key.write_bytes(contents[1])
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
            except ssl.SSLError as err:
                raise ValueError(
                    f"{self.cert} and {self.key} are not a PEM certificate and its private "
                    f"key: {err.reason or err}"
                ) from None
            self.context.load_cert_chain(cert, key)
        self._loaded = contents
        return True


async def _watch(tls: TLSFiles, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            if tls.refresh():
                logger.info("loaded the renewed TLS certificate %s", tls.cert)
        except ValueError as err:  # half-written by a renewal: the old one stays
            logger.warning("keeping the current TLS certificate: %s", err)


def reloading(tls: TLSFiles, interval: float) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context that refreshes ``tls`` every ``interval`` seconds while
    the application runs."""

    async def watch_certificate(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_watch(tls, interval))
        yield
        task.cancel()

    return watch_certificate

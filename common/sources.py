"""Where Cadence's services read weights from, and whom they give the pool's token.

The pool's bearer token opens every worker and the trainer of a pool, so it goes only
to them: to the trainer's URL a service was started with, and to peers on the pod
network, which is private address space (RFC 1918, carrier-grade NAT, loopback, IPv6
unique-local). Never to an address the internet routes, and never to link-local ones,
where cloud metadata services answer. A name is resolved first and every address it
resolves to must qualify.

Weights are read from such a URL (the trainer's or a peer's `/v1/weights/N`), or from a
directory the service was started with (`--weights-from`), never from any other path:
an API caller could otherwise have a service read any file it can. Files are read in a
thread, so a large one does not stall the event loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cadence.common.web import client_verify

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

POD_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "::1/128",
        "fc00::/7",
    )
)
FETCH_TIMEOUT_S = 300.0


class SourceRefused(ValueError):
    """A URL or path a service will not read from or send its token to."""


@dataclass(frozen=True)
class Destinations:
    """Who may receive the pool's token: hosts named here (the trainer's, as the
    service was configured), and any host whose addresses all lie in `networks`."""

    hosts: Collection[str] = frozenset()
    networks: tuple[Network, ...] = POD_NETWORKS
    resolve: bool = True  # False: only `hosts` and literal addresses qualify

    @staticmethod
    def of(*urls: str | None, networks: tuple[Network, ...] = POD_NETWORKS) -> Destinations:
        """The hosts of `urls` (the trainer's, an environment's) and the pod network."""
        hosts = {urllib.parse.urlsplit(u).hostname or "" for u in urls if u}
        return Destinations(frozenset(hosts - {""}), networks)

    async def check(self, url: str) -> None:
        """Raise `SourceRefused` unless `url` may receive the token."""
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise SourceRefused(f"{url} is not an http(s) URL")
        if host in self.hosts:
            return
        try:
            addresses: set[Address] = {ipaddress.ip_address(host)}
        except ValueError:
            addresses = await self._resolve(host, url)
        outside = [a for a in addresses if not any(a in n for n in self.networks)]
        if outside or not addresses:
            raise SourceRefused(
                f"{host} is not on the pool's network ({', '.join(map(str, outside))})"
            )

    async def _resolve(
        self, host: str, url: str
    ) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        if not self.resolve:
            raise SourceRefused(f"{host} is not one of the pool's hosts")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        except OSError:
            raise SourceRefused(f"{host} (in {url}) does not resolve") from None
        return {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}


@dataclass(frozen=True)
class WeightsSource:
    """Reads a version's weights from where a service may: a URL `destinations`
    allows, or a file under `directory`. With a `token` (a worker's), a URL must be a
    Cadence service's `/v1/weights/N` and gets the token; without (the trainer taking
    an external trainer's weights), any path on an allowed host, and no token."""

    token: str | None
    destinations: Destinations = field(default_factory=Destinations)
    directory: Path | None = None

    async def read(self, uri: str) -> bytes:
        if uri.startswith(("http://", "https://")):
            path = urllib.parse.urlsplit(uri).path
            if self.token is not None and not _weights_path(path):
                raise SourceRefused(f"{uri} is not a /v1/weights/N endpoint")
            await self.destinations.check(uri)
            auth = {} if self.token is None else {"Authorization": f"Bearer {self.token}"}
            async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, verify=client_verify()) as http:
                r = await http.get(uri, headers=auth)
                r.raise_for_status()
                return r.content
        return await asyncio.to_thread(self._file(uri).read_bytes)

    def _file(self, uri: str) -> Path:
        if self.directory is None:
            raise SourceRefused(f"{uri}: this service reads weights from no directory")
        root = self.directory.resolve()
        path = (root / uri.removeprefix("file://")).resolve()
        if not path.is_relative_to(root):
            raise SourceRefused(f"{uri} is outside {self.directory}")
        return path


def _weights_path(path: str) -> bool:
    head, _, version = path.rpartition("/")
    return head.endswith("/v1/weights") and version.isdigit()

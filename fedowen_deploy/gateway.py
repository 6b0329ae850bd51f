"""Fleet gateway: the only SuperLink door the devices' network gets, and it opens on Fleet only.

Flower 1.41-1.42 serve its Control API (``/v1/control/*``: list, register and unregister nodes,
start and stop runs), Fleet API (``/v1/fleet/*``: what SuperNodes call) and Runtime API
(``/v1/runtime/*``: what ServerApps and SuperExecs call) on one HTTPS port, and the Control API
has no authentication outside Flower Enterprise (OIDC). Anyone who can reach that port with
the public ``ca.crt`` can therefore administer the federation. Fleet's own register and
unregister routes are refused while ``--enable-supernode-auth`` is on, and every other Fleet
call is signed with a registered SuperNode key.

So the SuperLink binds to loopback (or a private operator address) and this gateway, on the
address the devices reach, terminates TLS with the SuperLink's certificate and forwards
``POST /v1/fleet/<route>`` to it, nothing else: any other method or path is answered ``403``
without reaching the SuperLink. Paths are matched against ``^/v1/fleet/[a-z-]+$`` so encoded
or dot-segment tricks (``/v1/fleet/../control/list-nodes``) cannot leave the Fleet API.

    python -m fedowen_deploy.gateway --listen 0.0.0.0:8000 --upstream https://127.0.0.1:8001 \\
        --ssl-certfile superlink.crt --ssl-keyfile superlink.key --ca-certfile ca.crt
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx

log = logging.getLogger("fedowen.gateway")
FLEET_PATH = re.compile(r"^/v1/fleet/[a-z][a-z-]*$")
#: Headers that describe one hop, not the request (RFC 9110 section 7.6.1), plus the ones
#: httpx sets itself.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding",
                         "upgrade", "host", "content-length"})

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def allowed(method: str, path: str) -> bool:
    """True for ``POST /v1/fleet/<route>`` only."""
    return method == "POST" and FLEET_PATH.match(path) is not None


def _forwarded(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.decode("latin-1").lower() not in HOP_HEADERS]


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body", False):
            return b"".join(chunks)


async def _refuse(send: Send, method: str, path: str) -> None:
    log.warning("refused %s %s: only POST /v1/fleet/<route> is served here", method, path)
    body = b'{"detail": "Forbidden: only the Fleet API is served on this address"}'
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class FleetGateway:
    """ASGI app forwarding Fleet calls to ``upstream`` (``https://host:port`` of the SuperLink,
    verified against ``ca_certfile``)."""

    def __init__(self, upstream: str, ca_certfile: str | None) -> None:
        self.upstream = upstream.rstrip("/")
        self.verify: str | bool = ca_certfile or True
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                self.client = httpx.AsyncClient(verify=self.verify, timeout=None)
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if not allowed(method, path):
            await _refuse(send, method, path)
            return
        assert self.client is not None, "lifespan startup did not run"
        request = self.client.build_request(
            "POST", self.upstream + path, headers=_forwarded(scope["headers"]),
            content=await _read_body(receive))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as err:
            log.error("SuperLink %s unreachable: %s", self.upstream, err)
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": _forwarded(response.headers.raw)})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve the gateway with uvicorn (TLS with the SuperLink's certificate)."""
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="0.0.0.0:8000", help="HOST:PORT the devices reach")
    p.add_argument("--upstream", required=True,
                   help="the SuperLink, e.g. https://127.0.0.1:8001 (loopback or private)")
    p.add_argument("--ssl-certfile", required=True, help="the SuperLink's certificate")
    p.add_argument("--ssl-keyfile", required=True, help="its private key")
    p.add_argument("--ca-certfile", default=None, help="CA that signed the SuperLink's cert")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--listen {args.listen!r}: expected HOST:PORT, e.g. 0.0.0.0:8000")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    uvicorn.run(FleetGateway(args.upstream, args.ca_certfile), host=host.strip("[]"),
                port=int(port),
                ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()

"""The Fleet API proxy: exactly Flower 1.42's Fleet paths pass, nothing else, one request per
connection, bodies forwarded byte for byte."""

from __future__ import annotations

import asyncio
import socket

import pytest

from adaptfl.deploy import fleet_proxy
from adaptfl.deploy.fleet_proxy import FLEET_PATHS, Refused, Upstream, parse_head


def _flower_paths(router) -> set[str]:
    """Every route's full path, also inside routers included into this one."""
    from fastapi.routing import iter_route_contexts

    return {ctx.route.path for ctx in iter_route_contexts(router.routes)
            if hasattr(ctx.route, "path")} | {r.path for r in router.routes if hasattr(r, "path")}


@pytest.mark.slow
def test_the_allowed_paths_are_exactly_flowers_fleet_routes() -> None:
    from flwr.superlink.routers.fleet.router import router as fleet

    assert _flower_paths(fleet) == FLEET_PATHS


def test_every_control_and_runtime_route_and_the_docs_are_refused() -> None:
    # The routers flwr/superlink/main.py mounts next to the Fleet router, and FastAPI's docs.
    from flwr.supercore.routers import health
    from flwr.supercore.routers.runtime import create_runtime_router, responses_router
    from flwr.superlink.routers.control.router import router as control

    other = set().union(*(_flower_paths(r) for r in (
        control, create_runtime_router("SuperLink"), responses_router, health.router)))
    other |= {"/docs", "/openapi.json", "/", "/v1/fleet", "/v1/fleet/"}
    assert len([p for p in other if p.startswith("/v1/control/")]) > 30
    assert len([p for p in other if p.startswith("/v1/runtime/")]) > 20
    for path in sorted(other):
        for method in ("POST", "GET"):
            with pytest.raises(Refused) as refused:
                parse_head(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert refused.value.status == 403, path


@pytest.mark.parametrize("head,status", [
    ("GET /v1/fleet/pull-messages HTTP/1.1\r\n\r\n", 403),
    ("POST /v1/fleet/pull-messages?x=1 HTTP/1.1\r\n\r\n", 403),
    ("POST /v1/fleet/../control/list-runs HTTP/1.1\r\n\r\n", 403),
    ("POST //v1/fleet/pull-messages HTTP/1.1\r\n\r\n", 403),
    ("POST /v1/fleet/pull-messages HTTP/2.0\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nContent-Length : 5\r\n\r\n", 400),
    (f"POST /v1/fleet/push-object HTTP/1.1\r\nContent-Length: {fleet_proxy.MAX_BODY + 1}\r\n\r\n", 413),
    # issue 21 §5: a bare LF inside a header value was forwarded (the SuperLink's parser
    # answers 400 today; the proxy must refuse it itself), and so were bare CR and NUL
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\nX-Smuggled: 1\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\n\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\ry\r\n\r\n", 400),
    ("POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\x00\r\n\r\n", 400),
])
def test_malformed_or_foreign_requests_are_refused(head, status) -> None:
    with pytest.raises(Refused) as refused:
        parse_head(head.encode())
    assert refused.value.status == status


def test_a_fleet_request_keeps_its_headers_and_gets_connection_close() -> None:
    request = parse_head(b"POST /v1/fleet/activate-node HTTP/1.1\r\nHost: fl:9092\r\n"
                         b"flwr-public-key: abc=\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n")
    assert request.body_length == 3 and request.path == "/v1/fleet/activate-node"
    assert request.head == (b"POST /v1/fleet/activate-node HTTP/1.1\r\nHost: fl:9092\r\n"
                            b"flwr-public-key: abc=\r\nContent-Length: 3\r\nConnection: close\r\n\r\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _exchange(payload: bytes) -> tuple[bytes, list[bytes]]:
    """Send `payload` through a proxy to a recording upstream; return (response, upstream saw)."""
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        body = await reader.readexactly(length)
        seen.append(head + body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    up_port, proxy_port = _free_port(), _free_port()
    up_server = await asyncio.start_server(upstream, "127.0.0.1", up_port)
    target = Upstream("127.0.0.1", up_port, None, None)
    proxy = await asyncio.start_server(lambda r, w: fleet_proxy.handle(r, w, target),
                                       "127.0.0.1", proxy_port, limit=fleet_proxy.MAX_HEAD)
    async with up_server, proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(payload)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    return response, seen


def test_a_large_body_passes_byte_for_byte_and_a_pipelined_request_does_not() -> None:
    body = bytes(range(256)) * (6 * 2**20 // 256 + 7)  # > Flower's 5 MiB chunks
    first = (b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: x\r\n"
             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    smuggled = b"POST /v1/control/start-run HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    response, seen = asyncio.run(_exchange(first + smuggled))
    assert response.endswith(b"\r\n\r\nok")
    assert len(seen) == 1 and seen[0].endswith(body) and b"/v1/control" not in seen[0]


def test_a_control_request_never_reaches_the_superlink() -> None:
    request = b"POST /v1/control/list-runs HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    response, seen = asyncio.run(_exchange(request))
    assert response.startswith(b"HTTP/1.1 403 ") and seen == []

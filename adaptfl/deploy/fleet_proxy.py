"""A reverse proxy that lets only Flower's Fleet API through to the SuperLink.

    python -m adaptfl.deploy.fleet_proxy --listen 0.0.0.0:8443 --upstream superlink:8000 \\
        --certfile server.pem --keyfile server.key --upstream-ca ca.crt

Flower 1.42 serves its Control API (`/v1/control/*`: `flwr run`, `flwr ls`, `flwr supernode
register`), Fleet API (`/v1/fleet/*`: the SuperNodes) and Runtime API (`/v1/runtime/*`: the
ServerApp's SuperExec) as HTTP/1.1 on one port. Whoever reaches that port with `ca.crt` can
enrol a key and run code on every SuperNode. This proxy is the only thing exposed: it answers
403 to anything but a POST to one of FLEET_PATHS, and forwards the rest unchanged (SuperNode
authentication headers included) to the SuperLink, which stays on loopback or a private network.

Deliberately narrow, so it can be read whole: one request per connection (`Connection: close`
both ways, so every request line is checked, never a pipelined one behind it), a body only by
one Content-Length (Transfer-Encoding refused: no request smuggling), bounded head and timeouts.
Fleet messages are bounded by Flower's 5 MiB object chunks; MAX_BODY leaves room.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass

log = logging.getLogger("adaptfl.fleet_proxy")

# Flower 1.42's Fleet router (flwr/superlink/routers/fleet/router.py, prefix /v1/fleet);
# tests/deploy/test_deploy_proxy.py checks this list against the installed Flower.
FLEET_PATHS = frozenset(f"/v1/fleet/{name}" for name in (
    "register-node", "activate-node", "deactivate-node", "unregister-node", "send-node-heartbeat",
    "pull-messages", "push-messages", "get-run", "get-fab", "push-object", "pull-object",
    "confirm-message-received"))
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 2**20
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te",
              "trailer", "upgrade"}
HEAD_TIMEOUT = 30.0
IO_TIMEOUT = 300.0  # a pull can wait; a stalled peer cannot hold a connection for ever


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    head: bytes  # the request line and headers to send upstream, ending in a blank line
    body_length: int


def parse_head(raw: bytes) -> Request:
    """Check one request head; raise Refused unless it is a plain POST to a Fleet path."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(400, "non-ASCII request head") from None
    if any(c in text.replace("\r\n", "") for c in "\r\n\x00"):
        # a bare LF (or CR, NUL) inside a line: parsers split such heads differently, which is
        # how requests are smuggled; the SuperLink answers 400 today, the proxy must not rely on it
        raise Refused(400, "bare CR, LF or NUL in the request head")
    line, *header_lines = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise Refused(400, f"malformed request line {line[:80]!r}")
    method, path, version = parts
    if method != "POST" or path not in FLEET_PATHS:
        raise Refused(403, f"{method} {path[:80]} is not part of the Fleet API")
    kept, lengths = [], []
    for header in header_lines:
        if not header:
            continue
        name, sep, value = header.partition(":")
        if not sep or name != name.strip() or not name:
            raise Refused(400, "malformed header line")
        lower = name.lower()
        if lower == "transfer-encoding":
            raise Refused(400, "Transfer-Encoding is not accepted (send Content-Length)")
        if lower == "content-length":
            lengths.append(value.strip())
        if lower not in HOP_BY_HOP:
            kept.append(f"{name}:{value}")
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
        raise Refused(400, "exactly one numeric Content-Length is required")
    body_length = int(lengths[0]) if lengths else 0
    if body_length > MAX_BODY:
        raise Refused(413, f"body of {body_length} bytes exceeds {MAX_BODY}")
    head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
    return Request(method, path, head.encode("ascii"), body_length)


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int
    ssl_context: ssl.SSLContext | None
    server_hostname: str | None


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
    except asyncio.LimitOverrunError:
        raise Refused(431, "request head too large") from None
    except (asyncio.IncompleteReadError, TimeoutError):
        raise Refused(400, "incomplete request head") from None


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None) -> None:
    """Copy `limit` bytes (None: until EOF) from reader to writer."""
    left = limit
    while left is None or left > 0:
        chunk = await asyncio.wait_for(reader.read(65536 if left is None else min(65536, left)),
                                       IO_TIMEOUT)
        if not chunk:
            if left:
                raise ConnectionError(f"peer closed with {left} body bytes missing")
            return
        writer.write(chunk)
        await writer.drain()
        if left is not None:
            left -= len(chunk)


async def _refuse(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = (reason + "\n").encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 413: "Content Too Large",
              431: "Request Header Fields Too Large", 502: "Bad Gateway"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: "
                 f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Upstream) -> None:
    peer = writer.get_extra_info("peername")
    up_writer = None
    try:
        request = parse_head(await _read_head(reader))
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
                upstream.host, upstream.port, ssl=upstream.ssl_context,
                server_hostname=upstream.server_hostname, limit=MAX_HEAD), HEAD_TIMEOUT)
        except (OSError, TimeoutError, ssl.SSLError) as err:
            raise Refused(502, f"SuperLink unreachable: {err}") from None
        up_writer.write(request.head)
        await _copy(reader, up_writer, request.body_length)
        await _copy(up_reader, writer, None)
    except Refused as refused:
        log.warning("refused %s: %s", peer, refused)
        await _refuse(writer, refused.status, str(refused))
    except (ConnectionError, TimeoutError, ssl.SSLError) as err:
        log.info("connection from %s ended: %s", peer, err)
    finally:
        for w in (up_writer, writer):
            if w is not None:
                w.close()


def server_ssl(certfile: str, keyfile: str) -> ssl.SSLContext | None:
    if not certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


def upstream_ssl(cafile: str) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=cafile) if cafile else None


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


async def serve(listen: str, upstream: Upstream, context: ssl.SSLContext | None) -> None:
    """`listen` is HOST:PORT, or fd:N: a listening socket bound by whoever started the proxy, in
    its own network namespace (adaptfl/deploy/netns.py: the proxy dials the SuperLink in another one)."""
    if listen.startswith("fd:"):
        sock = socket.socket(fileno=int(listen[3:]))
        server = await asyncio.start_server(lambda r, w: handle(r, w, upstream), sock=sock,
                                            ssl=context, limit=MAX_HEAD)
    else:
        host, port = split_address(listen)
        server = await asyncio.start_server(lambda r, w: handle(r, w, upstream), host, port,
                                            ssl=context, limit=MAX_HEAD)
    log.info("Fleet API proxy on %s -> %s:%s (TLS %s)", listen, upstream.host, upstream.port,
             "on" if context else "off")
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--listen", required=True, help="HOST:PORT the SuperNodes dial, or fd:N "
                        "(a socket already listening, inherited)")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the SuperLink")
    parser.add_argument("--certfile", default="", help="TLS certificate shown to SuperNodes")
    parser.add_argument("--keyfile", default="")
    parser.add_argument("--upstream-ca", default="", help="CA of the SuperLink's certificate "
                        "(TLS to the SuperLink); empty: plain HTTP, as an --insecure SuperLink")
    parser.add_argument("--upstream-name", default="",
                        help="name to check in the SuperLink's certificate (default: its host)")
    args = parser.parse_args()
    if bool(args.certfile) != bool(args.keyfile):
        parser.error("--certfile and --keyfile go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host, port = split_address(args.upstream)
    context = upstream_ssl(args.upstream_ca)
    upstream = Upstream(host, port, context,
                        (args.upstream_name or host) if context else None)
    asyncio.run(serve(args.listen, upstream, server_ssl(args.certfile, args.keyfile)))


if __name__ == "__main__":
    main()

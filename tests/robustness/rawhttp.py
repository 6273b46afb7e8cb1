"""Raw bytes over a socket, for requests no HTTP library will send (bad bytes in headers,
half a request, a stalled body) and for reading exactly what the daemon answers."""

from __future__ import annotations

import socket
import time


def raw_request(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send `data` and return everything the daemon answers until it closes the connection
    (requests built here say `Connection: close`). No half-close: aiohttp may take the EOF
    for a client that went away and drop the request."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        return read_all(s, timeout_s)


def read_all(s: socket.socket, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    out = b""
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def status_of(response: bytes) -> int:
    """The status code of the first response in `response` (0 if there is none)."""
    line = response.split(b"\r\n", 1)[0]
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return 0


def get(path: str, headers: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"


def post(path: str, body: bytes, content_type: bytes = b"application/json", headers: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
            + content_type + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + headers + b"\r\n"
            + body)

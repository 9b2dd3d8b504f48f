"""Raw TCP through one link, the reference for what a shaped link gives a TCP stream.

    python tcp_blast.py serve PORT             # prints "ready", then, at EOF, one JSON line
    python tcp_blast.py send HOST PORT SECONDS # sends 1 MiB buffers for SECONDS, then closes

The receiver reads into a preallocated buffer and reports the payload bytes and seconds from
its first byte to its last (`{"bytes": N, "seconds": S}`); run each side inside a host's
namespace (`ip netns exec`). Plain sockets, no numpy: it starts in milliseconds.
"""

from __future__ import annotations

import json
import socket
import sys
import time

BUFFER = 1 << 20


def serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            buf = bytearray(BUFFER)
            view = memoryview(buf)
            total, first, last = 0, None, None
            while n := conn.recv_into(view):
                last = time.monotonic()
                first = first or last
                total += n
    print(json.dumps({"bytes": total, "seconds": (last - first) if first else 0.0}), flush=True)


def send(host: str, port: int, seconds: float) -> None:
    payload = bytes(BUFFER)
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(payload)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))

"""Serve TOKEN on every TCP connection to 0.0.0.0:PORT until killed: `tcp_token_server.py PORT TOKEN`."""

import socket
import sys

port, token = int(sys.argv[1]), sys.argv[2].encode()
with socket.socket() as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(token + b"\n")

"""A TCP relay on 127.0.0.1 that forwards every connection to a target and records the bytes:
what a passive reader on the network between two tasks would see."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


UP, DOWN = "up", "down"  # client -> server, server -> client


@dataclass
class Conversation:
    """The bytes of one relayed connection, each way, and in the order they passed."""

    upstream: bytearray = field(default_factory=bytearray)
    downstream: bytearray = field(default_factory=bytearray)
    turns: list[tuple[str, bytes]] = field(default_factory=list)  # (UP or DOWN, bytes), as relayed
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, direction: str, data: bytes) -> None:
        with self.lock:
            (self.upstream if direction == UP else self.downstream).extend(data)
            self.turns.append((direction, data))

    def replay(self, sock: socket.socket) -> int:
        """Play the client's side of this conversation to a server on `sock`, in the same turns:
        send what the client sent, and wait for as many bytes as the server sent before the
        client went on. Stops early when the server hangs up. Returns the bytes received."""
        received = 0
        for direction, data in list(self.turns):
            if direction == UP:
                try:
                    sock.sendall(data)
                except OSError:
                    return received
                continue
            wanted = len(data)
            while wanted > 0:
                try:
                    chunk = sock.recv(wanted)
                except OSError:
                    return received
                if not chunk:
                    return received
                wanted -= len(chunk)
                received += len(chunk)
        return received


class Relay:
    """Accepts on a free loopback port; each connection is relayed by two threads (one per
    direction, so neither side can stall the other). `stop` closes everything. Thread-safe
    reads of `conversations` once the traffic of interest is over."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.conversations: list[Conversation] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = [self._listener]
        self._relayed: list[tuple[socket.socket, socket.socket]] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def recorded(self) -> bytes:
        """Everything relayed so far, both ways, all connections."""
        parts = []
        for conv in list(self.conversations):
            with conv.lock:
                parts += [bytes(conv.upstream), bytes(conv.downstream)]
        return b"".join(parts)

    def cut(self) -> None:
        """End every relayed connection (both ends see it closed); new ones are still relayed."""
        for conv_sockets in list(self._relayed):
            for sock in conv_sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Close the listener and every relayed connection. Idempotent."""
        self._stopped.set()
        for sock in list(self._sockets):
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                return
            server.settimeout(None)
            self._sockets += [client, server]
            self._relayed.append((client, server))
            conv = Conversation()
            self.conversations.append(conv)
            for src, dst, direction in ((client, server, UP), (server, client, DOWN)):
                threading.Thread(target=self._pump, args=(src, dst, conv, direction), name="relay-pump",
                                 daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, conv: Conversation, direction: str) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                conv.add(direction, data)  # before forwarding: the other side answers only after
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):  # one side left: end the other, as the network would
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

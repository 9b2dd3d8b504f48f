"""A client that hangs up its doorbell line reads the replies still on it first; one of them may
be a refusal of its shared area (a server that cannot attach it), which hangs up again from
inside that read. The line here is a real SOCK_SEQPACKET socket pair and the area a real memfd;
the client is put in the state it has once a server attached its area and answered its hello."""

from __future__ import annotations

import socket

import pytest

from shoal.wire import JobSecret, RpcClient
from shoal.wire.doorbell import BellState, Doorbell
from shoal.wire.message import encode
from shoal.wire.shared_area import ACK_KEY, AreaState, SharedArea, supported

pytestmark = pytest.mark.skipif(not supported(), reason="needs Linux memfds with seals")


def test_a_refusal_read_while_hanging_up_leaves_the_client_on_the_socket_without_a_line():
    client = RpcClient("127.0.0.1:1", JobSecret(b"k" * 32, "test"), "ps:0")
    ours, servers = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    area = SharedArea()
    area.open()
    area.state = AreaState.ATTACHED
    bell = Doorbell("test")
    bell._sock, bell.state = ours, BellState.UP
    client._area, client._bell = area, bell
    try:
        for rid in (7, 8):  # two replies left on the line: the first refuses the area
            servers.send(encode({"rid": rid, "ok": False, ACK_KEY: False, "error": "no area"}, None)[0])
        client._hang_up(read_first=True)  # it raised AttributeError once the first reply hung up
        assert client.bell_state is None
        assert client.shared_state is AreaState.REFUSED
        assert ours.fileno() == -1, "the line is closed"
    finally:
        servers.close()
        client.close()

"""A server logs the peers it refuses (address and reason), once per address and interval,
however often they retry (shoal/wire/refusals.py behind the gatekeeper). A real server and
real clients on 127.0.0.1, in this process so the log can be read."""

import logging

import pytest

from shoal.launch.ports import free_ports
from shoal.wire import AuthRejectedError, JobSecret, RpcClient, RpcServer, Security


@pytest.fixture
def server():
    address = f"127.0.0.1:{free_ports(1)[0]}"
    rpc = RpcServer(address, JobSecret(b"a" * 32, "test"), lambda request: None, "ps:0", security=Security.PLAIN)
    rpc.start()
    try:
        yield address
    finally:
        rpc.close()


def test_refused_peers_are_logged_with_their_address_and_reason_rate_limited(server, caplog):
    caplog.set_level(logging.INFO, logger="shoal")
    for _ in range(3):
        client = RpcClient(server, JobSecret(b"b" * 32, "test"), "ps:0", 10.0, security=Security.PLAIN)
        try:
            with pytest.raises(AuthRejectedError):
                client.call("status")
        finally:
            client.close()
    lines = [r for r in caplog.records if "refused a peer" in r.getMessage()]
    assert len(lines) == 1, caplog.text  # three refusals (and zmq's retries), one line
    assert lines[0].levelno == logging.WARNING
    assert lines[0].getMessage().startswith("ps:0 refused a peer at 127.0.0.1: not this job's credentials")

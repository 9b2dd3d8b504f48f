"""What a client concludes from its socket monitor's events (no sockets: the events are fed in)."""

import zmq

from shoal.wire.security import Security
from shoal.wire.watch import CURVE_HANGUPS_MEANING_REFUSED, ConnectionWatch


def test_a_plain_client_hung_up_on_repeatedly_is_told_the_security_settings_differ():
    watch = ConnectionWatch("ps:0", "127.0.0.1:2222", Security.PLAIN)
    for _ in range(CURVE_HANGUPS_MEANING_REFUSED - 1):
        watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
        watch.on_event(zmq.EVENT_DISCONNECTED, 0, True)
    assert watch.refusal is None  # once or twice may be a server restarting
    watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
    assert "different security settings" in watch.refusal and "ps:0 at 127.0.0.1:2222" in watch.refusal


def test_a_successful_handshake_between_hangups_starts_the_count_again():
    watch = ConnectionWatch("ps:0", "127.0.0.1:2222", Security.PLAIN)
    watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
    watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
    watch.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, True)
    watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
    assert watch.refusal is None and not watch.lost


def test_a_curve_client_hung_up_on_repeatedly_is_told_the_secrets_or_the_security_settings_differ():
    watch = ConnectionWatch("ps:0", "10.0.0.1:2222", Security.CURVE)
    for _ in range(CURVE_HANGUPS_MEANING_REFUSED):
        watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x20, True)
    assert "different job secrets, or it does not use CURVE" in watch.refusal
    assert "the same --wire_security" in watch.refusal  # a PLAIN ps hangs up on a CURVE hello too

"""The chief asks a ps `release` again exactly while the reply's `state` says BUSY: never because
of what an error's or a reason's text says. The ps here is a scripted peer on a real loopback
socket (its replies are what a ps of any wording could send); the PsClient is the real one."""

import itertools
import socket
import threading

import numpy as np
import pytest

from shoal.ps.client import PsClient
from shoal.ps.protocol import ProtocolFieldError, ReleaseReply, ReleaseRequest, ReleaseState
from shoal.train.growing import ReleaseBusyError, release_shards
from shoal.wire import JobSecret, RemoteError, RpcServer

pytestmark = pytest.mark.timeout(30)

SECRET = JobSecret(b"r" * 32, "test")
REQUEST = ReleaseRequest(("b",), 2)


class ScriptedPs:
    """A peer at a loopback address that answers the k-th request with `script[k]` (the last one
    again once the script is used up): a ReleaseReply with its tensors, or an error text. Serves
    on its own thread (RpcServer is single-threaded: started, served and closed there)."""

    def __init__(self, script):
        self.script = list(script)
        self.asked = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{s.getsockname()[1]}"
        self._stop = threading.Event()
        self._up = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "ScriptedPs":
        self._thread.start()
        assert self._up.wait(10), "the scripted ps did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _serve(self) -> None:
        server = RpcServer(self.address, SECRET, self._answer, "ps:0")
        server.start()
        self._server = server
        self._up.set()
        try:
            while not self._stop.is_set():
                server.serve_once(50)
        finally:
            server.close()

    def _answer(self, request) -> None:
        item = self.script[min(self.asked, len(self.script) - 1)]
        self.asked += 1
        if isinstance(item, str):
            self._server.reply_error(request, item)
        else:
            reply, tensors = item
            self._server.reply(request, reply.fields(), tensors)


def released(step):
    return ReleaseReply(step), {"b": np.full(2, float(step))}


def busy(step, reason):
    return ReleaseReply(step, ReleaseState.BUSY, reason), None


def ask(ps: ScriptedPs, **kwargs):
    client = PsClient([ps.address], SECRET, timeout_s=5.0)
    try:
        return release_shards(client, 0, REQUEST, **kwargs)
    finally:
        client.close()


def ticking(step_s):
    """A clock that moves `step_s` on at every reading: the retry time runs out after a few
    readings, whatever the machine's speed."""
    counter = itertools.count()
    return lambda: next(counter) * step_s


def test_release_is_asked_again_while_the_reply_says_busy_whatever_its_reason_says():
    with ScriptedPs([busy(3, "applying step 3, try later"), busy(3, "still applying"), released(4)]) as ps:
        answer = ask(ps)
    assert ps.asked == 3
    assert answer.body.state is ReleaseState.RELEASED and answer.body.step == 4
    np.testing.assert_array_equal(answer.tensors["b"], np.full(2, 4.0))


def test_release_refused_with_ask_again_in_its_text_is_not_asked_again():
    with ScriptedPs(["ps:0 has applied step 3 to ['a']; ask again in a moment"]) as ps:
        with pytest.raises(RemoteError, match="ask again"):
            ask(ps)
    assert ps.asked == 1


def test_release_still_busy_when_the_retry_time_is_up_raises_naming_the_ps_and_its_reason():
    with ScriptedPs([busy(3, "some of ['b'] still catch up a step")]) as ps:
        with pytest.raises(ReleaseBusyError, match=r"ps:0 still cannot release \['b'\] after 5s.*still catch up"):
            ask(ps, retry_s=5.0, clock=ticking(1.0))
    assert 1 < ps.asked < 10


# --- the reply on the wire ------------------------------------------------------------------

def test_release_reply_round_trips_both_states():
    for reply in (ReleaseReply(7), ReleaseReply(7, ReleaseState.BUSY, "mid-step; ask again")):
        assert ReleaseReply.decode(reply.fields()) == reply


def test_release_reply_without_a_state_is_released():
    """A ps that predates the field answered a release only when it released."""
    assert ReleaseReply.decode({"step": 3}) == ReleaseReply(3, ReleaseState.RELEASED)


@pytest.mark.parametrize("fields, field", [
    ({"step": 3, "state": "later"}, "state"),
    ({"step": 3, "state": "busy"}, "reason"),
    ({"step": 3, "state": "busy", "reason": "x" * 513}, "reason"),
    ({"step": 3, "state": "released", "reason": "ask again"}, "reason"),
    ({"step": -1, "state": "released"}, "step"),
])
def test_release_reply_with_a_bad_state_or_reason_is_refused_naming_the_field(fields, field):
    with pytest.raises(ProtocolFieldError, match=f"field '{field}'"):
        ReleaseReply.decode(fields)

import pytest
import zmq

from shoal.wire import JobSecret, Security
from shoal.wire.mechanisms import CurveMechanism, PlainMechanism, mechanism_for
from shoal.wire.secret import USERNAME


@pytest.mark.parametrize("address, want", [
    ("127.0.0.1:2222", Security.PLAIN), ("127.8.9.10:2222", Security.PLAIN), ("[::1]:2222", Security.PLAIN),
    ("localhost:2222", Security.PLAIN), ("LOCALHOST:2222", Security.PLAIN),
    ("10.0.0.5:2222", Security.CURVE), ("[fe80::1]:2222", Security.CURVE), ("0.0.0.0:2222", Security.CURVE),
    ("node7.cluster:2222", Security.CURVE), ("localhost.evil.example:2222", Security.CURVE),
])
def test_auto_is_plain_on_loopback_and_curve_elsewhere(address, want):
    assert Security.AUTO.resolve(address) is want
    assert type(mechanism_for(Security.AUTO, address, JobSecret(b"s", "test"))) is \
        (PlainMechanism if want is Security.PLAIN else CurveMechanism)


@pytest.mark.parametrize("choice", [Security.PLAIN, Security.CURVE])
def test_explicit_choice_holds_for_any_address(choice):
    assert choice.resolve("127.0.0.1:1") is choice and choice.resolve("10.0.0.1:1") is choice


def test_curve_keys_are_derived_deterministically_and_differ_by_role_and_secret():
    a, same, other = JobSecret(b"one", "t"), JobSecret(b"one", "t"), JobSecret(b"two", "t")
    assert a.curve_server_keys() == same.curve_server_keys() and a.curve_client_keys() == same.curve_client_keys()
    keys = {a.curve_server_keys().public, a.curve_client_keys().public,
            other.curve_server_keys().public, other.curve_client_keys().public}
    assert len(keys) == 4


def test_curve_public_key_belongs_to_its_secret_key_and_the_secret_stays_out_of_repr():
    keys = JobSecret(b"one", "t").curve_client_keys()
    assert zmq.curve_public(keys.secret) == keys.public and len(keys.public) == 40
    assert keys.secret not in repr(keys).encode() and b"one" not in keys.secret


def test_curve_server_accepts_only_the_derived_client_key():
    mech = CurveMechanism(JobSecret(b"one", "t"))
    good = JobSecret(b"one", "t").curve_client_keys().public_raw
    assert mech.check(b"CURVE", [good])
    assert not mech.check(b"CURVE", [JobSecret(b"two", "t").curve_client_keys().public_raw])
    assert not mech.check(b"CURVE", [JobSecret(b"one", "t").curve_server_keys().public_raw])
    assert not mech.check(b"PLAIN", [good]) and not mech.check(b"CURVE", [])


def test_plain_server_accepts_only_the_job_token():
    secret = JobSecret(b"one", "t")
    mech = PlainMechanism(secret)
    assert mech.check(b"PLAIN", [USERNAME, secret.token()])
    assert not mech.check(b"PLAIN", [USERNAME, JobSecret(b"two", "t").token()])
    assert not mech.check(b"CURVE", [USERNAME, secret.token()]) and not mech.check(b"PLAIN", [secret.token()])

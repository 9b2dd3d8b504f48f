"""The training flags' --wire_security: one choice reaches both sides of the wire (the session's
ps client and the ps server), as the Security enum; --wire_shared_memory and --ps_placement reach the session."""

import argparse

import pytest

import shoal
from shoal.wire import Security


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    shoal.add_training_flags(parser, {})
    return parser.parse_args(list(argv))


def test_wire_security_is_auto_on_both_sides_without_the_flag():
    args = parse()
    assert shoal.session_options(args)["security"] is Security.AUTO
    assert shoal.wire_security(args) is Security.AUTO


@pytest.mark.parametrize("value, want", [("plain", Security.PLAIN), ("curve", Security.CURVE)])
def test_wire_security_flag_reaches_session_options_and_ps_side(value, want):
    args = parse("--wire_security", value)
    assert shoal.session_options(args)["security"] is want
    assert shoal.wire_security(args) is want


def test_wire_security_flag_rejects_a_value_that_is_no_mechanism(capsys):
    with pytest.raises(SystemExit):
        parse("--wire_security", "tls")
    assert "invalid choice: 'tls'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, want", [((), True), (("--wire_shared_memory", "auto"), True),
                                        (("--wire_shared_memory", "off"), False)])
def test_wire_shared_memory_flag_reaches_session_options(argv, want):
    assert shoal.session_options(parse(*argv))["shared_memory"] is want


@pytest.mark.parametrize("argv, want", [((), shoal.PlacementStrategy.GREEDY),
                                        (("--ps_placement", "round_robin"), shoal.PlacementStrategy.ROUND_ROBIN)])
def test_ps_placement_flag_reaches_session_options(argv, want):
    assert shoal.session_options(parse(*argv))["placement"] is want


def test_a_program_may_keep_a_placement_flag_of_its_own():
    """Shoal's flag is --ps_placement: a program's own --placement (a device, say) still parses."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--placement", default="cpu")
    shoal.add_training_flags(parser, {})
    args = parser.parse_args(["--placement", "cuda:1", "--ps_placement", "round_robin"])
    assert args.placement == "cuda:1"
    assert shoal.session_options(args)["placement"] is shoal.PlacementStrategy.ROUND_ROBIN


def test_overlap_push_reaches_session_options_and_is_refused_with_sync(capsys):
    assert shoal.session_options(parse("--overlap_push"))["overlap_push"] is True
    assert shoal.session_options(parse())["overlap_push"] is False
    with pytest.raises(SystemExit):
        parse("--sync", "--overlap_push")
    assert "not allowed with argument --sync" in capsys.readouterr().err

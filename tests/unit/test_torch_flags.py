"""shoal.torch.add_flags keeps a program's own flags; init's session options come from the
flags, with defaults for those a program does not have."""

import argparse

from shoal.torch.flags import add_flags
from shoal.torch.job import _options


def test_program_flags_are_kept_and_the_rest_are_added():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7, help="the program's own")
    add_flags(parser, {"OUTPUT_DIR": "/out"})
    args = parser.parse_args(["--sync", "--ps_hosts", "h:1", "--worker_hosts", "h:2", "--job_name", "worker"])
    assert args.steps == 7 and args.sync and args.ps_hosts == "h:1" and args.model_dir == "/out"
    assert _options(args, {})["max_steps"] == 7


def test_options_use_defaults_and_environment_where_args_say_nothing():
    options = _options(argparse.Namespace(model_dir=None, log_every=5), {"OUTPUT_DIR": "/job/model"})
    assert options["model_dir"] == "/job/model" and options["summary_every_steps"] == 5
    assert options["sync"] is False and options["max_steps"] == 1000

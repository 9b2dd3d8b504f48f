import os
import stat

import pytest

from shoal.job_secret import resolve_job_secret
from shoal.wire import SecretError


def test_env_secret_wins_and_is_not_the_token():
    secret = resolve_job_secret({"SHOAL_JOB_SECRET": "s3cret", "SHOAL_JOB_SECRET_FILE": "/nonexistent"})
    assert secret.source == "SHOAL_JOB_SECRET"
    assert b"s3cret" not in secret.token() and len(secret.token()) == 64


def test_default_file_is_created_private_and_reused(tmp_path):
    env = {"SHOAL_HOME": str(tmp_path / "home")}
    first, second = resolve_job_secret(env), resolve_job_secret(env)
    assert first.value == second.value and len(first.value) == 64
    assert stat.S_IMODE(os.stat(tmp_path / "home" / "job_secret").st_mode) == 0o600


def test_missing_secret_file_names_the_path(tmp_path):
    with pytest.raises(SecretError, match="nope.txt"):
        resolve_job_secret({"SHOAL_JOB_SECRET_FILE": str(tmp_path / "nope.txt")})


def test_empty_secret_is_refused():
    with pytest.raises(SecretError, match="empty"):
        resolve_job_secret({"SHOAL_JOB_SECRET": ""})


def test_group_or_world_readable_secret_file_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("s3cret")
    for mode in (0o644, 0o640, 0o604):
        os.chmod(path, mode)
        with pytest.raises(SecretError, match=f"chmod 600 {path}"):
            resolve_job_secret({"SHOAL_JOB_SECRET_FILE": str(path)})
    os.chmod(path, 0o600)
    assert resolve_job_secret({"SHOAL_JOB_SECRET_FILE": str(path)}).value == b"s3cret"


def test_world_readable_default_secret_file_is_refused(tmp_path):
    env = {"SHOAL_HOME": str(tmp_path / "home")}
    resolve_job_secret(env)
    os.chmod(tmp_path / "home" / "job_secret", 0o644)
    with pytest.raises(SecretError, match="read or changed by others"):
        resolve_job_secret(env)

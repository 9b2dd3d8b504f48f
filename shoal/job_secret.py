"""`resolve_job_secret`: the job secret of this task, resolved once at the program's edge.

    secret = shoal.resolve_job_secret(os.environ)
    shoal.Server.for_task(config, secret=secret).join()

`SHOAL_JOB_SECRET`, else the file named by `SHOAL_JOB_SECRET_FILE`, else `$SHOAL_HOME/job_secret`
(default `~/.shoal/job_secret`, created 0600 on first use). See `shoal.wire.secret`.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.home import shoal_home
from shoal.wire.secret import JobSecret


def resolve_job_secret(environ: Mapping[str, str]) -> JobSecret:
    """The job secret from `environ` (pass `os.environ`). May create the default secret file;
    blocks on the filesystem. Raises SecretError naming the source and the fix."""
    return JobSecret.from_environ(environ, shoal_home(environ))

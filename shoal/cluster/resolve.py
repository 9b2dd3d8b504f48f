"""`resolve_cluster_config`: pick the cluster description a task was started with.

Flags win over TF_CONFIG. The caller passes the environment in (e.g. `os.environ`),
so this module never reads `os.environ` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from shoal.cluster.config import ClusterConfig
from shoal.cluster.errors import ClusterError
from shoal.cluster.flags import CLUSTER_FLAG_DESTS, config_from_flags
from shoal.cluster.tf_config import EXAMPLE, parse_tf_config


def resolve_cluster_config(
    namespace: Optional[Any] = None, environ: Optional[Mapping[str, str]] = None
) -> ClusterConfig:
    """Return the ClusterConfig from cluster flags, else from environ["TF_CONFIG"].

    Flags are used when any of --job_name, --ps_hosts, --worker_hosts, --chief_host was
    given (so a half-given set of flags is an error, not silently replaced by TF_CONFIG).
    An empty TF_CONFIG counts as unset. `environ` None means an empty environment.
    """
    if namespace is not None and any(getattr(namespace, d, None) for d in CLUSTER_FLAG_DESTS):
        return config_from_flags(namespace)
    tf_config = (environ or {}).get("TF_CONFIG", "")
    if tf_config.strip():
        return parse_tf_config(tf_config)
    raise ClusterError(
        "no cluster given: TF_CONFIG is unset and there are no cluster flags; start every task with the"
        " launcher (shoal run --ps 1 --workers 2 -- python PROGRAM ...), or give each task TF_CONFIG"
        f" (e.g. '{EXAMPLE}') or --job_name/--task_index/--ps_hosts/--worker_hosts"
    )

"""Cluster descriptions: ClusterSpec, TaskId, ClusterConfig, TF_CONFIG and cluster flags.

Pure data, parsed once at the edge: nothing here does I/O or reads os.environ.
Compatible with TensorFlow's ClusterSpec dicts and TF_CONFIG ('master' is read as 'chief').
"""

from shoal.cluster.config import ClusterConfig
from shoal.cluster.errors import ClusterError
from shoal.cluster.flags import add_cluster_flags, config_from_flags
from shoal.cluster.resolve import resolve_cluster_config
from shoal.cluster.spec import ClusterSpec
from shoal.cluster.task import JOBS, TaskId
from shoal.cluster.tf_config import parse_tf_config

__all__ = [
    "JOBS",
    "ClusterConfig",
    "ClusterError",
    "ClusterSpec",
    "TaskId",
    "add_cluster_flags",
    "config_from_flags",
    "parse_tf_config",
    "resolve_cluster_config",
]

"""Parameter servers: shards, update rules (run on the ps, state kept there), sync aggregation."""

from shoal.ps.errors import PsError
from shoal.ps.optimizers import RULES, SGD, Adagrad, Adam, AdamW, Momentum, UpdateRule, rule_from_config
from shoal.ps.server import Server

__all__ = ["RULES", "SGD", "Adagrad", "Adam", "AdamW", "Momentum", "PsError", "Server", "UpdateRule", "rule_from_config"]

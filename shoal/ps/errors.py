"""Errors raised by parameter servers (sent back to the worker as the error of its request)."""

from shoal.errors import ShoalError


class PsError(ShoalError):
    """A parameter server refused a request or could not serve."""


class ShardsMoved(PsError):
    """A ps answered a push or pull with MOVED: shards it released moved to a ps that joined the
    job (shoal/train/growing.py). `moved` maps each of the request's ps (the client's index) to the
    shard names it said moved; those were neither applied nor returned. The request's other parts
    were answered as usual. `parts`: the positions, among the request's parts, of those answered
    MOVED (a push sends each of them again, whole, by the new placement: a shard of it the old ps
    counted already is answered `duplicate` there). The caller learns the new placement first."""

    def __init__(self, message: str, moved: dict[int, tuple[str, ...]], parts: tuple[int, ...] = ()):
        super().__init__(message)
        self.moved = moved
        self.parts = parts

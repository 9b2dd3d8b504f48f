"""Between ps shards and whole variables: what a checkpoint stores and what a restore sends.

On the wire a shard's optimizer slot travels as the tensor "<shard>@<slot>". A slot shaped like
its shard (Adam's m and v, Momentum's accum) is split and joined along the first axis like the
variable; any other slot (Adam's step count t, a scalar) is the same on every shard of a
variable, because every push updates every shard, so one copy is kept. This is what lets a
checkpoint written with 2 ps tasks restore into 3.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from shoal.ps.protocol import SLOT_SEPARATOR, slot_key
from shoal.train.checkpoint import CheckpointError, Slots
from shoal.train.placement import Placement, ShardPlacement


def gather(placement: Placement, per_ps: list[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], Slots]:
    """Join the snapshot tensors of every ps (shard values and "<shard>@<slot>") into whole
    variables and whole slots."""
    tensors: dict[str, np.ndarray] = {}
    for received in per_ps:
        tensors.update(received)
    slots_of: dict[str, set[str]] = {}  # shard -> its slot names
    for key in tensors:
        shard, sep, slot = key.rpartition(SLOT_SEPARATOR)
        if sep:
            slots_of.setdefault(shard, set()).add(slot)
    by_variable: dict[str, list[ShardPlacement]] = {}
    for s in placement.shards:
        by_variable.setdefault(s.variable, []).append(s)
    variables: dict[str, np.ndarray] = {}
    slots: Slots = {}
    for name, shards in by_variable.items():
        parts = [_need(tensors, s.name) for s in shards]
        variables[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        for slot in sorted(slots_of.get(shards[0].name, ())):
            pieces = [_need(tensors, slot_key(s.name, slot)) for s in shards]
            if len(pieces) > 1 and all(p.shape == v.shape for p, v in zip(pieces, parts)):
                slots.setdefault(name, {})[slot] = np.concatenate(pieces)
            else:
                slots.setdefault(name, {})[slot] = pieces[0]
    return variables, slots


def scatter(placement: Placement, variables: Mapping[str, np.ndarray], slots: Slots,
            only_ps: int | None = None) -> list[dict[str, np.ndarray]]:
    """Per ps task, the tensors that (re)create its shards: values and "<shard>@<slot>"."""
    out: list[dict[str, np.ndarray]] = [{} for _ in range(placement.num_ps)]
    for s in placement.shards:
        if only_ps is not None and s.ps != only_ps:
            continue
        value = variables[s.variable]
        out[s.ps][s.name] = s.rows(value)
        for slot, slot_value in slots.get(s.variable, {}).items():
            if slot_value.shape == value.shape:  # shaped like the variable: split like it
                slot_value = s.rows(slot_value)
            out[s.ps][slot_key(s.name, slot)] = np.require(slot_value, requirements="C")
    return out


def check_fits(variables: Mapping[str, np.ndarray], saved: Mapping[str, np.ndarray], where: str) -> None:
    """Raise CheckpointError unless `saved` holds exactly the model's variables, same shapes."""
    missing, extra = variables.keys() - saved.keys(), saved.keys() - variables.keys()
    if missing or extra:
        raise CheckpointError(f"the checkpoint {where} does not fit this model: missing {sorted(missing)}, "
                              f"unknown {sorted(extra)}; use a fresh --model_dir for a different model")
    for name, value in variables.items():
        if saved[name].shape != value.shape or saved[name].dtype != value.dtype:
            raise CheckpointError(f"variable {name!r} in the checkpoint {where} is {saved[name].dtype}"
                                  f"{list(saved[name].shape)}, the model has {value.dtype}{list(value.shape)}; "
                                  "use a fresh --model_dir for a different model")


def _need(tensors: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    value = tensors.get(name)
    if value is None:
        raise CheckpointError(f"a ps did not send {name!r} in its snapshot; do all tasks build the same model?")
    return value

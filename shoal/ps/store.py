"""The variable shards one parameter server holds, with their update-rule state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping

import numpy as np
import zmq

from shoal.ps.errors import PsError
from shoal.ps.optimizers import State, UpdateRule
from shoal.ps.protocol import Hyper, slot_key

_MAX_HYPER_RULES = 64  # distinct (learning rate, weight decay) pairs kept with their rule


@dataclass
class Shard:
    """One variable shard: its value, its optimizer slots, and replies still reading it."""

    value: np.ndarray
    state: State
    senders: list[zmq.MessageTracker] = field(default_factory=list)
    gradient: np.ndarray | None = None  # reused receive buffer for this shard's pushed gradients

    def writable_value(self) -> np.ndarray:
        """The value, safe to change in place.

        Replies send `value` without copying; if one is still in flight we move to a fresh
        copy instead of waiting (copy-on-write), so a slow reader never stalls the server and
        never sees a half-updated tensor.
        """
        if self.senders:
            if any(not t.done for t in self.senders):
                self.value = self.value.copy()
            self.senders.clear()
        return self.value


def _check_trainable(name: str, value: np.ndarray) -> None:
    """PsError unless `value` is floating point: an update rule adds a gradient times a
    learning rate to it, which an integer or bool variable cannot take."""
    if value.dtype.kind != "f":
        raise PsError(f"variable {name!r} is {value.dtype}: a ps updates its variables with gradients, so each must"
                      " be floating point (float16, float32 or float64); keep a counter or a mask in the program"
                      " itself, not among the variables the ps holds")


class ShardStore:
    """name -> Shard. Not thread-safe: used only by its server's serving thread."""

    def __init__(self, task_name: str):
        self.task_name = task_name
        self.rule: UpdateRule | None = None
        self._shards: dict[str, Shard] = {}
        self._nbytes = 0  # a shard's size never changes (copy-on-write keeps it), so this is kept, not summed
        # (learning rate, weight decay) -> `rule` with them: a push names the same few every step
        self._hyper_rules: dict[tuple[float, float], UpdateRule] = {}

    def __len__(self) -> int:
        return len(self._shards)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def create(self, values: Mapping[str, np.ndarray], rule: UpdateRule,
               slots: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> int:
        """Create the shards that do not exist yet; existing ones keep their values (so the
        chief's initialization happens once even if it runs twice). `slots` (shard -> slot ->
        value, from a checkpoint) replace the rule's fresh state. Returns how many were new."""
        if self.rule is not None and self.rule != rule:
            raise PsError(f"{self.task_name} already trains with {self.rule.to_config()}, "
                          f"not {rule.to_config()}; start every worker with the same optimizer")
        slots = slots or {}
        unknown = slots.keys() - values.keys()
        if unknown:
            raise PsError(f"optimizer state sent for {sorted(unknown)[:5]} without their values")
        for name, value in values.items():  # every one first: a refused init changes nothing
            _check_trainable(name, value)
        created = 0
        for name, value in values.items():
            existing = self._shards.get(name)
            if existing is not None:
                self.check(name, value.shape, value.dtype)
                continue
            param = np.array(value, copy=True)
            state = rule.init_state(param)
            for slot, saved in slots.get(name, {}).items():
                fresh = state.get(slot)
                if fresh is None or fresh.shape != saved.shape or fresh.dtype != saved.dtype:
                    raise PsError(f"optimizer state {name}@{slot} {saved.dtype}{list(saved.shape)} does not fit "
                                  f"{rule.name} (slots: {', '.join(f'{k} {v.dtype}{list(v.shape)}' for k, v in state.items()) or 'none'})")
                state[slot] = np.array(saved, copy=True)
            self._shards[name] = Shard(param, state)
            self._nbytes += param.nbytes
            created += 1
        if rule is not self.rule:
            self._hyper_rules.clear()
        self.rule = rule
        return created

    def snapshot(self) -> dict[str, np.ndarray]:
        """Copies of every shard's value and slots ("<shard>@<slot>"), consistent with each other."""
        out = {}
        for name, shard in self._shards.items():
            out[name] = shard.value.copy()
            for slot, value in shard.state.items():
                out[slot_key(name, slot)] = value.copy()
        return out

    def release(self, names: Collection[str]) -> dict[str, np.ndarray]:
        """Remove shards `names` (they move to another ps) and return their values and slots
        ("<shard>@<slot>"). The arrays are handed over, not copied: no update touches them any
        more (a reply still sending one reads it unchanged)."""
        out = {}
        for name in names:
            shard = self.check_name(name)
            out[name] = shard.value
            for slot, value in shard.state.items():
                out[slot_key(name, slot)] = value
        for name in names:
            self._nbytes -= self._shards.pop(name).value.nbytes
        return out

    def check(self, name: str, shape, dtype) -> Shard:
        """The shard `name`, after checking a worker's idea of its shape and dtype."""
        shard = self._shards.get(name)
        if shard is None:
            raise PsError(f"{self.task_name} holds no variable {name!r}; every task must build the same "
                          "model with the same number of ps tasks and placement")
        value = shard.value
        # (a decoded gradient's shape is a tuple and its dtype a dtype: no conversion needed)
        if (shape if type(shape) is tuple else tuple(shape)) != value.shape or dtype != value.dtype:
            raise PsError(f"variable {name!r} on {self.task_name} is {shard.value.dtype}{list(shard.value.shape)}, "
                          f"but a worker sent {np.dtype(dtype)}{list(shape)}; every task must build the same model")
        return shard

    def apply(self, grads: Mapping[str, np.ndarray], hyper: Mapping[str, Hyper] | None = None) -> None:
        """Apply one (already averaged) gradient per shard with the update rule, with the
        learning rate and weight decay `hyper` names for the shard when it is given."""
        # every rule and shard first: a push refused for one shard changes none
        rules = [self.rule] * len(grads) if hyper is None else [self._rule_with(hyper[name]) for name in grads]
        shards = [self.check(name, grad.shape, grad.dtype) for name, grad in grads.items()]
        for rule, shard, grad in zip(rules, shards, grads.values()):
            rule.apply(shard.writable_value(), grad, shard.state)

    def check_hyper(self, hyper: Mapping[str, Hyper]) -> None:
        """Check that the update rule takes every hyper (a param group's) of a push. Raises
        PsError if it cannot take one (a weight decay on a rule without it), changing nothing."""
        for h in hyper.values():
            self._rule_with(h)

    def _rule_with(self, hyper: Hyper) -> UpdateRule:
        """The update rule with `hyper`'s learning rate and weight decay, made once per distinct
        pair (a push carries the same few every step; `with_hyper` builds a new rule). Raises
        PsError as `with_hyper` does; a refused pair is not kept."""
        key = (hyper.learning_rate, hyper.weight_decay)
        rule = self._hyper_rules.get(key)
        if rule is None:
            rule = self.rule.with_hyper(*key)
            if len(self._hyper_rules) >= _MAX_HYPER_RULES:  # (a schedule that changes lr every step)
                self._hyper_rules.clear()
            self._hyper_rules[key] = rule
        return rule

    def gradient_buffer(self, name: str, dtype, shape) -> np.ndarray | None:
        """A buffer to receive a gradient of shard `name` into, reused for every push (the
        serving thread consumes each gradient before it reads the next request). None if the
        shard does not exist or the shape/dtype differ (the op then reports the mismatch)."""
        shard = self._shards.get(name)
        if shard is None or shard.value.shape != tuple(shape) or shard.value.dtype != dtype:
            return None
        if shard.gradient is None:
            shard.gradient = np.empty_like(shard.value)
        return shard.gradient

    def names(self) -> Collection[str]:
        """The names of the shards this ps holds (a live view)."""
        return self._shards.keys()

    def values(self, names) -> dict[str, np.ndarray]:
        return {name: self.check_name(name).value for name in names}

    def check_name(self, name: str) -> Shard:
        shard = self._shards.get(name)
        if shard is None:
            raise PsError(f"{self.task_name} holds no variable {name!r}; has the chief initialized the model? (every "
                          "task places the variables itself: give each the same model, --ps_placement and "
                          "--push_part_bytes)")
        return shard

    def track(self, names, tracker: zmq.MessageTracker | None) -> None:
        """Remember that a reply is still sending these shards' values."""
        if tracker is not None:
            for name in names:
                self._shards[name].senders.append(tracker)

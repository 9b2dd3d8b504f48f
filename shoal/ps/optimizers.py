"""Update rules that run on the parameter servers and keep their state there.

SGD, Momentum, Adam and Adagrad follow TensorFlow's formulas (tf.compat.v1.train.*Optimizer), so
hyper-parameters carry over; weight decay (SGD, Momentum) is PyTorch's L2 term, g + wd * p, which
TensorFlow's optimizers do not have. AdamW is PyTorch's Adam/AdamW (torch.optim.Adam with
`decoupled_weight_decay=False`, torch.optim.AdamW with True). SGD and Momentum with momentum > 0
equal torch.optim.SGD (dampening 0): tests/unit/test_torch_rules.py checks every rule PyTorch has
against torch.optim.

A rule travels from the chief to the ps as a small dict (`to_config`), validated on arrival. A
push may carry its own learning rate and weight decay per shard (a PyTorch param group's, read
every step): `with_hyper` is the rule with those. Rules update parameters in place; they are not
thread-safe (one serving thread per ps).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from shoal.ps.errors import PsError

State = dict[str, np.ndarray]


class UpdateRule(ABC):
    """How a parameter changes given its (averaged) gradient."""

    name: ClassVar[str]

    def init_state(self, param: np.ndarray) -> State:
        """Fresh slots for one parameter shard (empty for stateless rules)."""
        return {}

    @abstractmethod
    def apply(self, param: np.ndarray, grad: np.ndarray, state: State) -> None:
        """Update `param` (and `state`) in place."""

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}  # type: ignore[call-overload]

    def with_hyper(self, learning_rate: float, weight_decay: float) -> "UpdateRule":
        """This rule with another learning rate and weight decay (those a push carries). Raises
        PsError for a weight decay on a rule that has none."""
        if not any(f.name == "weight_decay" for f in fields(self)):  # type: ignore[arg-type]
            if weight_decay:
                raise PsError(f"update rule {self.name} has no weight decay, but a push asked for {weight_decay!r}; "
                              "use sgd, momentum or adamw")
            return replace(self, learning_rate=learning_rate)  # type: ignore[type-var]
        return replace(self, learning_rate=learning_rate, weight_decay=weight_decay)  # type: ignore[type-var]


def _decayed(grad: np.ndarray, param: np.ndarray, weight_decay: float) -> np.ndarray:
    """PyTorch's L2 weight decay: the gradient plus `weight_decay` times the parameter."""
    return grad + weight_decay * param if weight_decay else grad


@dataclass(frozen=True)
class SGD(UpdateRule):
    learning_rate: float = 0.01
    weight_decay: float = 0.0
    name: ClassVar[str] = "sgd"

    def apply(self, param, grad, state):
        param -= self.learning_rate * _decayed(grad, param, self.weight_decay)


@dataclass(frozen=True)
class Momentum(UpdateRule):
    learning_rate: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    name: ClassVar[str] = "momentum"

    def init_state(self, param):
        return {"accum": np.zeros_like(param)}

    def apply(self, param, grad, state):
        grad = _decayed(grad, param, self.weight_decay)
        accum = state["accum"]
        accum *= self.momentum
        accum += grad
        if self.nesterov:
            param -= self.learning_rate * (grad + self.momentum * accum)
        else:
            param -= self.learning_rate * accum


@dataclass(frozen=True)
class Adam(UpdateRule):
    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    name: ClassVar[str] = "adam"

    def init_state(self, param):
        return {"m": np.zeros_like(param), "v": np.zeros_like(param), "t": np.zeros((), np.int64)}

    def apply(self, param, grad, state):
        state["t"] += 1
        t = int(state["t"])
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * grad
        v *= self.beta2
        v += (1 - self.beta2) * np.square(grad)
        lr_t = self.learning_rate * math.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t)
        param -= lr_t * m / (np.sqrt(v) + self.epsilon)


@dataclass(frozen=True)
class Adagrad(UpdateRule):
    learning_rate: float = 0.01
    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    name: ClassVar[str] = "adagrad"

    def init_state(self, param):
        return {"accum": np.full_like(param, self.initial_accumulator_value)}

    def apply(self, param, grad, state):
        accum = state["accum"]
        accum += np.square(grad)
        param -= self.learning_rate * grad / (np.sqrt(accum) + self.epsilon)


@dataclass(frozen=True)
class AdamW(UpdateRule):
    """PyTorch's Adam family: epsilon is added after the bias-corrected square root (TensorFlow's
    Adam adds it before). `decoupled_weight_decay` (torch.optim.AdamW) shrinks the parameter by
    lr * weight_decay before the step; without it (torch.optim.Adam) weight decay is L2, added to
    the gradient. The defaults are torch.optim.AdamW's."""

    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.01
    decoupled_weight_decay: bool = True
    name: ClassVar[str] = "adamw"

    def init_state(self, param):
        return {"m": np.zeros_like(param), "v": np.zeros_like(param), "t": np.zeros((), np.int64)}

    def apply(self, param, grad, state):
        if self.decoupled_weight_decay:
            if self.weight_decay:
                param *= 1 - self.learning_rate * self.weight_decay
        else:
            grad = _decayed(grad, param, self.weight_decay)
        state["t"] += 1
        t = int(state["t"])
        m, v = state["m"], state["v"]
        m += (1 - self.beta1) * (grad - m)  # torch's lerp
        v *= self.beta2
        v += (1 - self.beta2) * np.square(grad)
        step_size = self.learning_rate / (1 - self.beta1 ** t)
        denom = np.sqrt(v) / math.sqrt(1 - self.beta2 ** t)
        denom += self.epsilon
        param -= step_size * m / denom


RULES: dict[str, type[UpdateRule]] = {r.name: r for r in (SGD, Momentum, Adam, Adagrad, AdamW)}


def rule_from_config(config: Any) -> UpdateRule:
    """Build a rule from `to_config()` output received over the wire; validates every field."""
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise PsError(f"optimizer config must be a map with a 'name', got {config!r:.200}")
    cls = RULES.get(config["name"])
    if cls is None:
        raise PsError(f"unknown optimizer {config['name']!r:.50}; use one of {', '.join(RULES)}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in config:
            continue
        value = config[f.name]
        want = bool if f.type in (bool, "bool") else float
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is float and not math.isfinite(value)):
            raise PsError(f"optimizer {cls.name} field {f.name!r} must be a finite {want.__name__}, got {value!r:.50}")
        kwargs[f.name] = value
    unknown = set(config) - {"name"} - {f.name for f in fields(cls)}
    if unknown:
        named = ", ".join(repr(k)[:50] for k in sorted(map(str, unknown))[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise PsError(f"optimizer {cls.name} has no field(s) {named}{more}; its fields are"
                      f" {', '.join(f.name for f in fields(cls))}")
    return cls(**kwargs)

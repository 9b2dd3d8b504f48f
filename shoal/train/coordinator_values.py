"""Step arguments and results on the wire: tensors and plain values, never anything executable.

A value is None, a bool, int, float or str, a numpy array (or numpy scalar, sent as a plain
number), or a list, tuple or str-keyed dict of values. `encode_values` turns values into a
tagged tree of msgpack-native data (one `[tag, payload]` pair per node) plus the tensors it
refers to by name; `decode_values` checks every node and rebuilds the values. A
`PerWorkerDataset` travels as a reference (`["D", id]`) that the worker resolves to its own
iterator, so data never goes through the coordinator.

Pure functions; no I/O; thread-safe.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from shoal.train.coordinator_errors import BadValueError

MAX_DEPTH = 16
MAX_NODES = 10_000
TENSOR_PREFIX = "v"


class DatasetRef:
    """A reference to a per-worker dataset by id; what a `PerWorkerDataset` becomes on the wire."""

    __slots__ = ("id",)

    def __init__(self, dataset_id: int):
        self.id = dataset_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("dataset", self.id))

    def __repr__(self) -> str:
        return f"DatasetRef({self.id})"


def encode_values(values: Any, prefix: str = TENSOR_PREFIX) -> tuple[Any, dict[str, np.ndarray]]:
    """(tagged tree, tensors by name) for `values`. Raises BadValueError naming the first value
    that cannot travel (a function, an object, a dict with a non-str key, ...)."""
    tensors: dict[str, np.ndarray] = {}
    count = [0]

    def enc(value: Any, where: str, depth: int) -> list:
        count[0] += 1
        if depth > MAX_DEPTH or count[0] > MAX_NODES:
            raise BadValueError(f"{where}: values nest deeper than {MAX_DEPTH} or hold more than {MAX_NODES} items; "
                                "send tensors instead of long lists")
        if value is None:
            return ["n", None]
        if isinstance(value, (bool, np.bool_)):
            return ["b", bool(value)]
        if isinstance(value, (int, np.integer)):
            return ["i", int(value)]
        if isinstance(value, (float, np.floating)):
            return ["f", float(value)]
        if isinstance(value, str):
            return ["s", value]
        if isinstance(value, np.ndarray):
            name = f"{prefix}{len(tensors)}"
            tensors[name] = value
            return ["t", name]
        if isinstance(value, DatasetRef) or hasattr(value, "dataset_ref"):
            ref = value if isinstance(value, DatasetRef) else value.dataset_ref
            return ["D", ref.id]
        if isinstance(value, (list, tuple)):
            tag = "l" if isinstance(value, list) else "u"
            return [tag, [enc(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]]
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise BadValueError(f"{where}: dict keys must be strings, got {bad[0]!r:.50}")
            return ["d", {k: enc(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}]
        raise BadValueError(f"{where} is a {type(value).__name__}, which cannot be sent to a worker; send "
                            "tensors (numpy arrays), numbers, strings, None, or lists/tuples/dicts of them, and "
                            "register code on the workers by name instead of sending it")

    tree = enc(values, "value", 0)
    return tree, tensors


def decode_values(tree: Any, tensors: Mapping[str, np.ndarray],
                  dataset: Callable[[int], Any] | None = None, where: str = "value") -> Any:
    """The values `tree` encodes, its tensors taken from `tensors`. `dataset(id)` resolves a
    dataset reference (None: references stay `DatasetRef`s). Raises BadValueError naming the
    first malformed node."""
    count = [0]

    def dec(node: Any, at: str, depth: int) -> Any:
        count[0] += 1
        if depth > MAX_DEPTH or count[0] > MAX_NODES:
            raise BadValueError(f"{at}: values nest deeper than {MAX_DEPTH} or hold more than {MAX_NODES} items")
        if not (isinstance(node, list) and len(node) == 2 and isinstance(node[0], str)):
            raise BadValueError(f"{at}: a value must be [tag, payload], got {node!r:.80}")
        tag, payload = node
        checks = {"n": lambda p: p is None, "b": lambda p: isinstance(p, bool),
                  "i": lambda p: isinstance(p, int) and not isinstance(p, bool),
                  "f": lambda p: isinstance(p, float) or (isinstance(p, int) and not isinstance(p, bool)),
                  "s": lambda p: isinstance(p, str)}
        if tag in checks:
            if not checks[tag](payload):
                raise BadValueError(f"{at}: payload {payload!r:.50} does not fit tag {tag!r}")
            return float(payload) if tag == "f" else payload
        if tag == "t":
            if not isinstance(payload, str) or payload not in tensors:
                raise BadValueError(f"{at}: tensor {payload!r:.50} is not among the message's tensors")
            return tensors[payload]
        if tag == "D":
            if not isinstance(payload, int) or isinstance(payload, bool) or payload < 0:
                raise BadValueError(f"{at}: dataset reference must be an int >= 0, got {payload!r:.50}")
            return DatasetRef(payload) if dataset is None else dataset(payload)
        if tag in ("l", "u"):
            if not isinstance(payload, list):
                raise BadValueError(f"{at}: a list must carry a list, got {payload!r:.50}")
            items = [dec(v, f"{at}[{i}]", depth + 1) for i, v in enumerate(payload)]
            return items if tag == "l" else tuple(items)
        if tag == "d":
            if not isinstance(payload, dict) or not all(isinstance(k, str) for k in payload):
                raise BadValueError(f"{at}: a dict must carry a map with string keys, got {payload!r:.50}")
            return {k: dec(v, f"{at}[{k!r}]", depth + 1) for k, v in payload.items()}
        raise BadValueError(f"{at}: unknown value tag {tag!r:.20}")

    return dec(tree, where, 0)

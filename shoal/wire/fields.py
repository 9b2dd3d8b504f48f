"""Reading one field of a message header, checked: the value, or an error that names the
message, the field, what it must be and what came. Shared by the protocols that travel on the
wire (the ps's, shoal/ps/protocol.py; the coordinator's, shoal/train/coordinator_protocol.py),
each with its own error type. Pure functions; thread-safe."""

from __future__ import annotations

from typing import Any, Mapping


class FieldReaders:
    """Readers of header fields that raise `error(message)` for a missing or bad value."""

    def __init__(self, error: type[Exception]):
        self.error = error

    def fail(self, where: str, key: str, want: str, value: Any) -> Exception:
        """The error for field `key` of message `where`, which must be `want` and is `value`."""
        return self.error(f"{where}: field {key!r} must be {want}, got {value!r:.100}")

    def int(self, fields: Mapping[str, Any], where: str, key: str, minimum: int = 0, default: int | None = None,
            maximum: int | None = None) -> int:
        value = fields.get(key, default)
        if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
                or (maximum is not None and value > maximum)):
            want = f"an int >= {minimum}" if maximum is None else f"an int from {minimum} to {maximum}"
            raise self.fail(where, key, want, value)
        return value

    def optional_int(self, fields: Mapping[str, Any], where: str, key: str, minimum: int) -> int | None:
        return None if fields.get(key) is None else self.int(fields, where, key, minimum)

    def bool(self, fields: Mapping[str, Any], where: str, key: str, default: bool | None = None) -> bool:
        value = fields.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(where, key, "true or false", value)
        return value

    def str(self, fields: Mapping[str, Any], where: str, key: str, max_len: int = 256,
            allow_empty: bool = False) -> str:
        value = fields.get(key)
        if not isinstance(value, str) or len(value) > max_len or (not value and not allow_empty):
            raise self.fail(where, key, f"a string of {0 if allow_empty else 1} to {max_len} characters", value)
        return value

    def names(self, fields: Mapping[str, Any], where: str, key: str, max_len: int = 512,
              required: bool = False) -> tuple[str, ...]:
        """A list of non-empty strings (an empty list when missing, unless `required`)."""
        if not required and key not in fields:  # (the usual case of an optional list: nothing to check)
            return ()
        value = fields.get(key)
        if not isinstance(value, list) or not all(isinstance(n, str) and 0 < len(n) <= max_len for n in value):
            raise self.fail(where, key, "a list of names", value)
        return tuple(value)

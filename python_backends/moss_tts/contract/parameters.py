"""Triton pbtxt `parameters` (every value a string) -> the typed fields of a config dataclass.

EngineConfig and VocoderConfig read their settings from their model's parameters the same way:
a key that names a field is parsed by that field's type, and a value that does not parse names
its key. Keys that name no field belong to the adapter (or to nobody) and are left alone.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Iterable, Mapping

_BOOLS = {"true": True, "1": True, "false": False, "0": False}


def parse_parameter(name: str, text: str, kind: str) -> bool | int | float | str:
    """`text` as `kind` ("bool", "int", "float", or "str": the text stripped, for the config to check
    against its choices); ValueError naming the key otherwise."""
    value = str(text).strip()
    if kind == "str":
        return value
    try:
        if kind == "bool":
            return _BOOLS[value.lower()]
        return float(value) if kind == "float" else int(value)
    except (KeyError, ValueError):
        raise ValueError(f"parameter {name}={text!r} is not a valid {kind}") from None


def config_fields(cls, parameters: Mapping[str, str], skip: Iterable[str] = ()) -> dict:
    """{field: parsed value} for the `parameters` that name a field of the dataclass `cls` (the
    fields in `skip` are the adapter's to set). The types are the fields' annotations."""
    kinds = {f.name: f.type for f in fields(cls) if f.name not in set(skip)}
    return {name: parse_parameter(name, text, kinds[name]) for name, text in parameters.items() if name in kinds}


def switch_interval_s(parameters: Mapping[str, str], default_ms: float = 0.05) -> float:
    """`gil_switch_interval_ms` as seconds, for sys.setswitchinterval: how long a thread that
    wants the GIL back waits for a busy holder to yield it. Shorter favours the engine thread
    (which gives the GIL up at every device call) over the threads that hold it long."""
    name = "gil_switch_interval_ms"
    value = parse_parameter(name, parameters[name], "float") if name in parameters else default_ms
    if not 0.01 <= value <= 100:
        raise ValueError(f"parameter {name}={value:g} must lie in [0.01, 100] (milliseconds)")
    return value / 1000

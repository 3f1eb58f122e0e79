"""Small helpers shared by the model_repository adapters. Importable only inside Triton's
Python backend stub (it imports triton_python_backend_utils)."""

from __future__ import annotations

import json
import re
from typing import Callable, Optional

import numpy as np
import triton_python_backend_utils as pb_utils

# Error kinds by name; the stub binds TritonError only after model.py is imported, so the
# numeric codes are looked up when an error is made, never at import time.
INVALID, UNAVAILABLE, CANCELLED, INTERNAL = "invalid", "unavailable", "cancelled", "internal"
_CODE_ATTRS = {INVALID: "INVALID_ARG", UNAVAILABLE: "UNAVAILABLE", CANCELLED: "CANCELLED", INTERNAL: "INTERNAL"}
# gRPC stream responses carry only a message, not a status code, so every error message of
# ours starts with the gRPC code name in brackets: "[INVALID_ARGUMENT] input TEXT is empty ...".
GRPC_NAMES = {INVALID: "INVALID_ARGUMENT", UNAVAILABLE: "UNAVAILABLE", CANCELLED: "CANCELLED", INTERNAL: "INTERNAL"}
_PREFIX = re.compile(r"^(in ensemble '[^']*', )?\[([A-Z_]+)\] ")


def model_parameters(args: dict) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def model_config(args: dict) -> dict:
    return json.loads(args["model_config"])


def require_decoupled(config: dict) -> None:
    """Load-time contract check: the model streams, so its pbtxt must say decoupled."""
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise pb_utils.TritonModelException(
            f"{config['name']} must be decoupled: set model_transaction_policy {{ decoupled: true }}")


def getter(request) -> Callable[[str], Optional[np.ndarray]]:
    def get(name: str) -> Optional[np.ndarray]:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()
    return get


def error(message: str, code: str = INVALID):
    return pb_utils.TritonError(f"[{GRPC_NAMES[code]}] {strip_prefix(message)}",
                                getattr(pb_utils.TritonError, _CODE_ATTRS[code]))


def strip_prefix(message: str) -> str:
    """Drop a child's "[CODE] " tag (and Triton's "in ensemble 'x', ") before re-tagging."""
    return _PREFIX.sub("", message, count=1)


def error_response(message: str, code=INVALID):
    return pb_utils.InferenceResponse(output_tensors=[], error=error(message, code))


def bytes_tensor(name: str, values: list[bytes | str], shape) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.array(values, dtype=np.object_).reshape(shape))


def error_kind(err) -> str:
    """A child's TritonError as one of our kind names, from its code or else its "[CODE]" tag."""
    match = _PREFIX.match(err.message())
    if match:
        return {v: k for k, v in GRPC_NAMES.items()}.get(match.group(2), INTERNAL)
    try:
        code = err.code()
    except Exception:  # older stubs have no code()
        return INTERNAL
    for kind, attr in _CODE_ATTRS.items():
        if code == getattr(pb_utils.TritonError, attr):
            return kind
    return INTERNAL

"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right status.

Sources of errors and their statuses:
  request body over the limit                      413 request_too_large
  JSON / schema / limits / references / formats    400 invalid_request_error (reference too big: 413)
  unknown `model` (not a served name or alias)     404 model_not_found
  tritonserver "[INVALID_ARGUMENT] ..."            400
  tritonserver "[UNAVAILABLE] server busy ..."     429 rate_limit_exceeded (retry later)
  tritonserver "[UNAVAILABLE] ..." / unreachable   503 service_unavailable
  a dead model stub ("... is not healthy")         503 service_unavailable
  a model heartbeat stopped (app.py)               503 service_unavailable
  no Triton response within --response-timeout     504 timeout
  anything else                                    500 internal_error
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import grpc
from pydantic import ValidationError

from moss_tts.contract.errors import ErrorKind, classify, is_busy, is_dead_stub


@dataclass(eq=False)  # exceptions keep identity hashing
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: Optional[str] = None
    code: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.status} {self.code or self.type}: {self.message}"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def too_large(message: str, param: Optional[str] = None, code: str = "request_too_large") -> ApiError:
    return ApiError(413, message, param=param, code=code)


def model_not_found(model: str, served: tuple[str, ...]) -> ApiError:
    return ApiError(404, f"model {model!r} is not served here; use one of {list(served)} (GET /v1/models)",
                    param="model", code="model_not_found")


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="server_error", code="service_unavailable")


def timeout(message: str) -> ApiError:
    return ApiError(504, message, type="server_error", code="timeout")


def internal(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")


def from_triton_message(message: str) -> ApiError:
    """A final error response of the `moss_tts` stream (moss_tts.contract.classify)."""
    kind, text = classify(message)
    if is_dead_stub(message):
        return unavailable(f"{text}: the server needs a restart")
    if kind is ErrorKind.INVALID_ARGUMENT:
        return bad_request(text)
    if is_busy(kind, text):
        return ApiError(429, f"{text}; retry later", type="rate_limit_error", code="rate_limit_exceeded")
    if kind is ErrorKind.UNAVAILABLE:
        return unavailable(text)
    if kind is ErrorKind.CANCELLED:  # not asked for by us: the server is shutting down or dropped the request
        return unavailable(f"the synthesis was cancelled by the server: {text}")
    return internal(f"synthesis failed: {text}")


def from_grpc(exc: grpc.aio.AioRpcError) -> ApiError:
    """The gRPC call itself failed (tritonserver down, deadline, ...)."""
    status, details = exc.code(), exc.details() or ""
    if status == grpc.StatusCode.UNAVAILABLE:
        return unavailable(f"tritonserver is unreachable: {details}")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return timeout(f"tritonserver did not answer in time: {details}")
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ApiError(429, f"tritonserver is overloaded: {details}; retry later", type="rate_limit_error",
                        code="rate_limit_exceeded")
    return from_triton_message(details)


def _describe(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}: not supported by this server (see README, OpenAI-compatible API)"
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def from_validation(exc: ValidationError) -> ApiError:
    """pydantic errors -> one 400 naming every bad field; `param` is the first one."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    param = ".".join(str(part) for part in first["loc"]) or (first.get("ctx") or {}).get("param")
    code = "unknown_parameter" if first["type"] == "extra_forbidden" else "invalid_value"
    return bad_request("; ".join(_describe(error) for error in errors), param=param, code=code)

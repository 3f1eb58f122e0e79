"""The public contract of the Triton models, written once: tensor names, dtypes, shapes,
defaults and limits (the error kinds and their "[CODE] message" tags: errors.py).

The model adapters, `client.tts_client`, the OpenAI shim and the docs derive from this module,
and tests/test_contract.py checks it against every config.pbtxt. No torch, no Triton: clients
import it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The sampling options, their defaults and ranges: declared in sampling_options.py, named here too.
from .sampling_options import (AUDIO_REPETITION_PENALTY, AUDIO_TEMPERATURE, AUDIO_TOP_K, AUDIO_TOP_P,  # noqa: F401
                               MAX_REPETITION_PENALTY, MAX_TEMPERATURE, STOP_TEMPERATURE, STOP_TOP_K, STOP_TOP_P,
                               sampling_inputs)

# The released model and codec (MossTTSConfig validates a checkpoint against these).
N_VQ = 12  # RVQ codebooks per frame
CODEBOOK_SIZE = 1024  # codes 0..1023 per codebook
FRAME_RATE = 12.5  # frames per second
SAMPLE_RATE = 48000
CHANNELS = 2
SAMPLES_PER_FRAME = 3840  # SAMPLE_RATE / FRAME_RATE

# Request limits. A request also has to fit the engine's row budget (moss_tts parameter
# max_seq_len): prompt rows + frames <= max_seq_len; the server says so when it does not.
MAX_TEXT_CHARS = 20000
MAX_SESSION_ID_CHARS = 128  # SESSION_ID: a client-chosen string (a uuid4 is 36)
MAX_REQUEST_ID_CHARS = 256  # STOP names a request by its gRPC request id


def stop_request_id(request_id: str) -> str:
    """The id a client gives the STOP of request `request_id` (its final response tells the two apart)."""
    return f"{request_id}.stop"


# A text session's voice is its first request's: these inputs are refused on a later one.
SESSION_VOICE_INPUTS = ("REFERENCE_AUDIO", "REFERENCE_CODES", "REFERENCE_TEXT", "MODE")
MAX_REFERENCE_SECONDS = 100.0
MAX_FRAMES = 22500  # 30 min: the most MAX_FRAMES / TOKENS may ask for on any engine size
DEFAULT_MAX_FRAMES = 4096  # without MAX_FRAMES: what fits in max_seq_len, at most this
MAX_CHUNK_FRAMES = 250  # 20 s of audio per response at most

MODES = {"clone": "clone", "voice_clone": "clone", "continuation": "continuation"}

# Triton dtype name -> numpy dtype
NUMPY_DTYPES = {"BYTES": np.object_, "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64,
                "UINT64": np.uint64, "FP32": np.float32}


@dataclass(frozen=True)
class Tensor:
    """One input or output as config.pbtxt declares it (dtype without TYPE_, BYTES = TYPE_STRING)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False

    @property
    def numpy_dtype(self):
        return NUMPY_DTYPES[self.dtype]


def _option(name: str, dtype: str) -> Tensor:
    return Tensor(name, dtype, (1,), optional=True)


# Text sessions (sessions/registry.py): consecutive requests with one SESSION_ID speak as
# one stream, one voice; SESSION_END (TEXT may be empty) ends it after its earlier requests.
# SESSION_INDEX (0, 1, 2, ...: the request's place in its session) orders them by index, not
# by arrival: needed when the server has several moss_tts instances (a request that reaches
# another instance than the session's is relayed to it and arrives late). moss_tts only: the
# codes ensemble has no sessions.
SESSION_INPUTS = (
    _option("SESSION_ID", "BYTES"),
    _option("SESSION_END", "BOOL"),
    _option("SESSION_INDEX", "INT32"),
)

# moss_tts: text (+ options) -> AUDIO and/or CODES, streamed (decoupled).
MOSS_TTS_INPUTS = (
    Tensor("TEXT", "BYTES", (1,)),
    _option("REFERENCE_AUDIO", "BYTES"),
    # [1, frames, 12]: the moss_tts_codes ensemble passes ref_encoder's output, batch dim included.
    Tensor("REFERENCE_CODES", "INT32", (1, -1, N_VQ), optional=True),
    _option("REFERENCE_TEXT", "BYTES"),
    _option("MODE", "BYTES"),
    _option("LANGUAGE", "BYTES"),
    _option("INSTRUCTIONS", "BYTES"),
    _option("TOKENS", "INT32"),
    *(_option(name, dtype) for name, dtype in sampling_inputs()),  # TEMPERATURE ... STOP_TOP_K
    _option("SEED", "INT64"),
    _option("MAX_FRAMES", "INT32"),
    _option("IGNORE_STOP", "BOOL"),
    _option("STREAM", "BOOL"),
    _option("FIRST_CHUNK_FRAMES", "INT32"),
    _option("CHUNK_FRAMES", "INT32"),
    _option("REQUEST_ID", "BYTES"),
    *SESSION_INPUTS,
    # STOP: a request of its own (TEXT empty, nothing else) on the client's stream that ends the
    # running request whose gRPC request id it names; the stopped request ends with [CANCELLED],
    # the STOP with an empty final response. Instead of a gRPC cancel, which can wedge or crash
    # tritonserver 2.51 (docs/structure.md, "A wedge of 2.51's gRPC stream handler").
    _option("STOP", "BYTES"),
)
MOSS_TTS_OUTPUTS = (
    Tensor("AUDIO", "FP32", (CHANNELS, -1)),
    Tensor("CODES", "INT32", (-1, N_VQ)),
    Tensor("CONTEXT_CODES", "INT32", (-1, N_VQ)),
)
# The ensemble takes every moss_tts input but the sessions' and these: it always takes
# REFERENCE_AUDIO ([1, 1], empty = none) because ref_encoder runs first, fills REFERENCE_CODES
# itself (ENSEMBLE_FILLED), always streams (no STREAM input) and has no STOP (an ensemble's steps
# cannot be named by a later request).
ENSEMBLE_FILLED = {"REFERENCE_CODES": "reference_codes"}  # moss_tts input: the ensemble tensor it gets
MOSS_TTS_CODES_INPUTS = tuple(Tensor(t.name, t.dtype, (1, 1), optional=False) if t.name == "REFERENCE_AUDIO" else t
                              for t in MOSS_TTS_INPUTS
                              if t not in SESSION_INPUTS and t.name not in (*ENSEMBLE_FILLED, "STREAM", "STOP"))
MOSS_TTS_CODES_OUTPUTS = MOSS_TTS_OUTPUTS[1:]
# Batched models: dims without the batch dimension.
REF_ENCODER_INPUTS = (Tensor("REFERENCE_AUDIO", "BYTES", (1,)),)
REF_ENCODER_OUTPUTS = (Tensor("REFERENCE_CODES", "INT32", (-1, N_VQ)),)
VOCODER_INPUTS = (Tensor("CODES", "INT32", (-1, N_VQ)),)
VOCODER_OUTPUTS = (Tensor("AUDIO", "FP32", (CHANNELS, -1)),)

CONTRACTS = {
    "moss_tts": (MOSS_TTS_INPUTS, MOSS_TTS_OUTPUTS),
    "moss_tts_codes": (MOSS_TTS_CODES_INPUTS, MOSS_TTS_CODES_OUTPUTS),
    "ref_encoder": (REF_ENCODER_INPUTS, REF_ENCODER_OUTPUTS),
    "vocoder": (VOCODER_INPUTS, VOCODER_OUTPUTS),
}
INPUTS = {t.name: t for t in MOSS_TTS_INPUTS}


def input_array(name: str, value, shape=(1,)) -> np.ndarray:
    """A moss_tts input value as the array its declared dtype needs. Integers outside the dtype's
    range raise ValueError (numpy < 2 would wrap them silently: 2**32 + 5 -> 5). REFERENCE_CODES
    takes codes [frames, 12] (a saved voice) and gets its [1, frames, 12]."""
    spec = INPUTS.get(name)
    if spec is None:
        raise ValueError(f"unknown input {name!r}; moss_tts takes {', '.join(INPUTS)}")
    if name == "REFERENCE_CODES":
        return np.ascontiguousarray(value, dtype=spec.numpy_dtype).reshape(1, -1, N_VQ)
    if spec.dtype == "BYTES":
        value = value.encode("utf-8") if isinstance(value, str) else value
    elif spec.dtype.startswith(("INT", "UINT")):
        if isinstance(value, bool) or int(value) != value:
            raise ValueError(f"input {name} must be an integer, got {value!r}")
        info = np.iinfo(spec.numpy_dtype)
        if not info.min <= int(value) <= info.max:
            raise ValueError(f"input {name} must fit {spec.dtype.lower()} [{info.min}, {info.max}], got {value}")
    return np.array([value], dtype=spec.numpy_dtype).reshape(shape)

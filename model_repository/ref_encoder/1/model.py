"""ref_encoder: REFERENCE_AUDIO [B, 1] (file bytes) -> REFERENCE_CODES [B, frames, 12] (int32).

Decode -> stereo 48 kHz -> loudness-normalise -> 12 quantizers, behind a content-addressed
LRU cache (xxh3_64 of the bytes + encoder config). Concurrent misses on the same bytes encode
once; the misses of one dynamic batch go to the codec together. Empty bytes mean "no
reference" and give 0 frames. Unusable audio is INVALID_ARG for that request only. A request of
several references gets one row each, the shorter ones padded with -1 (PAD_CODE).
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from moss_tts.codec.checkpoint import load_codec
from moss_tts.contract.errors import error_text
from moss_tts.contract.tensors import N_VQ
from moss_tts.reference.audio import AudioError
from moss_tts.reference.encoder import ReferenceCacheConfig, ReferenceEncoder
from moss_tts.serving import metrics, triton_io as io
from moss_tts.serving.placement import checkpoint_dirs, resolve_device, use_device
from moss_tts.serving.stall_watch import StallWatch

# Rows past a shorter item's length in a multi-reference request (no codebook has code -1).
PAD_CODE = -1
COUNTERS = ("hits", "misses", "coalesced_waits", "encodes", "items_encoded", "evictions")


class TritonPythonModel:
    def initialize(self, args):
        params = io.model_parameters(args)
        device = use_device(resolve_device(params.get("device"), int(args["model_instance_device_id"])))
        # The encoder runs in fp32: reference codes are discrete, and bf16 rounding flips them.
        codec_dir = checkpoint_dirs()[1]
        codec = load_codec(codec_dir, device, parts=("encoder", "quantizer")).eval()  # no decoder: ~half the weights
        config = ReferenceCacheConfig(max_entries=int(params.get("cache_max_entries", 8192)),
                                      max_bytes=int(params.get("cache_max_bytes", 64 << 20)))
        self.encoder = ReferenceEncoder(codec, config, encoder_id=str(codec_dir.resolve()))
        self.encoder.warm_up()  # the GPU kernels compile now, not in front of the first requests
        self.counters = metrics.Counters("moss_ref_cache_total", "reference cache events", COUNTERS, label="event")
        self.watch = StallWatch()
        # Encoding a 100 s reference can take a while on a CPU; a minute is not normal anywhere.
        self.heartbeat = io.Heartbeat(args, self.watch.oldest, stall_limit_s=60.0)

    def execute(self, requests):
        with self.watch.working("an encode (execute)"):
            return self._execute(requests)

    def _execute(self, requests):
        # A request may carry several references ([B, 1]); the dynamic batcher joins requests too.
        # Every item is encoded (one codec call for the misses of the whole batch) and validated.
        items = [[bytes(a) for a in io.getter(r)("REFERENCE_AUDIO").reshape(-1)] for r in requests]
        flat = self._encode([a for audios in items for a in audios])
        responses, start = [], 0
        for audios in items:
            results, start = flat[start:start + len(audios)], start + len(audios)
            bad = [(k, r) for k, r in enumerate(results) if isinstance(r, Exception)]
            if bad:
                where = f"item {bad[0][0]} of {len(audios)}: " if len(audios) > 1 else ""
                responses.append(io.error_response(f"{where}{error_text(bad[0][1])}"))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REFERENCE_CODES", _stack(results))]))
        self._publish()
        return responses

    def _encode(self, audios):
        """Codes [frames, 12] int32 per reference (empty bytes: 0 frames), or its AudioError."""
        wanted = [i for i, a in enumerate(audios) if a]
        results = [np.zeros((0, N_VQ), dtype=np.int32)] * len(audios)
        try:
            codes = self.encoder.encode_many([audios[i] for i in wanted])
            for i, c in zip(wanted, codes):
                results[i] = c.numpy().astype(np.int32)
            return results
        except AudioError:
            pass  # some item is unusable: the good ones are cached now, so ask one by one
        for i in wanted:
            try:
                results[i] = self.encoder.encode_many([audios[i]])[0].numpy().astype(np.int32)
            except AudioError as exc:
                results[i] = exc
        return results

    def _publish(self):
        self.counters.publish(vars(self.encoder.stats()))

    def finalize(self):
        metrics.release_metrics()  # the heartbeat's and the counters' (a metric alive after finalize crashes the stub)


def _stack(codes: list) -> np.ndarray:
    """[B, frames, 12]: one row per item; a shorter item is padded with PAD_CODE to the longest."""
    frames = max(c.shape[0] for c in codes)
    out = np.full((len(codes), frames, N_VQ), PAD_CODE, dtype=np.int32)
    for k, c in enumerate(codes):
        out[k, :c.shape[0]] = c
    return out

"""vocoder: CODES [1, frames, 12] of one sequence -> AUDIO [1, 2, frames * 3840] (48 kHz stereo).

Sequence batcher (direct): START opens codec state for the correlation id, END frees it after
decoding that request's chunk; a START with no codes primes nothing and returns no samples.
Chunks of several sequences in one execute are decoded together (one call per chunk length).
Sequences idle past max_sequence_idle_microseconds are freed by a janitor thread (also when no
request comes), so an abandoned stream never holds its slot. Sequences started without the
pipeline's internal key (direct clients) share `max_public_sessions` slots.
"""

import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from moss_tts.codec.checkpoint import load_codec
from moss_tts.contract.errors import ErrorKind, error_text
from moss_tts.contract.metrics import BATCH_SIZE_BUCKETS, Histogram
from moss_tts.contract.tensors import N_VQ
from moss_tts.serving import metrics, triton_io as io
from moss_tts.serving.placement import checkpoint_dirs, resolve_device, resolve_dtype, use_device
from moss_tts.serving.stall_watch import StallWatch
from moss_tts.vocoder import internal_key
from moss_tts.vocoder.config import (NoFreeSlot, VocoderConfig, codec_fusion, codec_ring_dtype, codec_ring_kernel,
                                     codec_small_gemm_rows)
from moss_tts.vocoder.sessions import VocoderSessions


WORK_STATS = ("executes", "requests", "execute_ms", "decode_calls", "frames_decoded", "sessions_started",
              "sessions_ended", "sessions_cancelled", "sessions_expired", "sessions_failed", "graph_calls")


class TritonPythonModel:
    def initialize(self, args):
        config, params = io.model_config(args), io.model_parameters(args)
        device = use_device(resolve_device(params.get("device"), int(args["model_instance_device_id"])))
        dtype = resolve_dtype(params.get("dtype"), device)
        codec = load_codec(checkpoint_dirs()[1], device, dtype, parts=("quantizer", "decoder")).eval()  # no encoder
        # LayerScale in the GEMMs, weight norm computed once; on a GPU the norms and GELU as `fusion`
        # says, streaming attention as `ring_kernel` says, small steps' GEMMs as `small_gemm_rows` says, rings
        # stored as `ring_dtype` says
        codec.serving_form_(codec_fusion(params), codec_ring_kernel(params), codec_small_gemm_rows(params),
                            codec_ring_dtype(params))
        # CUDA graph warm-up and capture happen here, inside VocoderSessions (~50 s on the H200).
        max_slots = int(params.get("max_slots") or config["max_batch_size"])
        if not 1 <= max_slots <= config["max_batch_size"]:
            raise ValueError(f"vocoder parameter max_slots must lie in [1, max_batch_size={config['max_batch_size']}], "
                             f"got {max_slots}")
        self.sessions = VocoderSessions(codec, VocoderConfig.from_parameters(
            params, max_slots=max_slots, device=str(device),
            dtype="bfloat16" if dtype == torch.bfloat16 else "float32", cuda_graphs=True))
        idle_us = int(config["sequence_batching"].get("max_sequence_idle_microseconds", 1_000_000))
        self.idle_seconds = idle_us / 1e6
        self.key = internal_key.internal_key()
        self.watch = StallWatch()
        self.heartbeat = io.Heartbeat(args, self.watch.oldest)
        instance = args["model_instance_name"]
        self.slots = metrics.Gauges("moss_vocoder_sessions", "vocoder codec state slots", ("active", "free"),
                               self._slots, label="state", instance=instance)
        self.execute_ms = 0.0
        # Requests per execute: its count is the executes, its sum the requests (WORK_STATS).
        # requests / executes is the batch the sequence batcher formed, execute_ms / executes the
        # time one batch took, frames_decoded / decode_calls the rows per codec call.
        self.batch_sizes = Histogram(BATCH_SIZE_BUCKETS)
        self.batch_gauges = metrics.HistogramGauges("moss_vocoder_batch_size", "requests per vocoder execute",
                                               BATCH_SIZE_BUCKETS, instance)
        self.gauges = metrics.Gauges("moss_vocoder", "vocoder work counters", WORK_STATS, self._work, interval_s=0.5,
                                after=lambda: self.batch_gauges.set(self.batch_sizes.cumulative()), instance=instance)
        self._lock = threading.Lock()  # the janitor never expires a sequence in the middle of an execute
        self._stop = threading.Event()
        self._janitor = threading.Thread(target=self._expire_idle, name="vocoder-janitor", daemon=True)
        self._janitor.start()

    def _expire_idle(self):
        while not self._stop.wait(min(0.5, self.idle_seconds / 4)):
            with self._lock:
                self.sessions.expire(self.idle_seconds)

    def execute(self, requests):
        start = time.perf_counter()
        with self.watch.working("a decode (execute)"), self._lock:
            responses = self._execute(requests)
            self.batch_sizes.observe(len(requests))
            self.execute_ms += (time.perf_counter() - start) * 1e3
            return responses

    def _execute(self, requests):
        self.sessions.expire(self.idle_seconds)
        responses = [None] * len(requests)
        chunks, ends = {}, []
        for i, request in enumerate(requests):
            get = io.getter(request)
            seq = int(get("CORRID").reshape(-1)[0])
            try:
                # Checked before START takes a slot: a refused first chunk must not hold one.
                codes = self.sessions.check(seq, torch.from_numpy(get("CODES")).reshape(-1, N_VQ))
                if bool(get("START").reshape(-1)[0]):
                    if seq in self.sessions:
                        self.sessions.end(seq)  # a restarted id starts from fresh state
                    self.sessions.start(seq, is_public=not internal_key.is_internal(request.parameters(), self.key))
                elif seq not in self.sessions:
                    raise KeyError(f"sequence {seq} has no codec state (not started, ended or idle-expired)")
                chunks[seq] = (i, codes)
            except NoFreeSlot as exc:
                responses[i] = io.error_response(str(exc), ErrorKind.UNAVAILABLE)
            except (KeyError, ValueError) as exc:
                responses[i] = io.error_response(error_text(exc))
            if bool(get("END").reshape(-1)[0]):
                ends.append(seq)
        self._decode(chunks, responses)
        for seq in ends:
            if seq in self.sessions:
                self.sessions.end(seq)
        return responses

    def _decode(self, chunks, responses):
        try:
            # Every chunk was checked as its request was read (before START took a slot).
            audio = self.sessions.decode({seq: codes for seq, (_, codes) in chunks.items()}, checked=True)
        except Exception as exc:  # one bad chunk must not take the others' state down silently
            # Out of memory is load, not a defect: the caller may retry (with graphs on, every
            # step replays a captured graph and allocates nothing, so only cuda_graphs=false
            # can get here that way).
            kind = ErrorKind.UNAVAILABLE if isinstance(exc, torch.cuda.OutOfMemoryError) else ErrorKind.INTERNAL
            for seq, (i, _) in chunks.items():
                responses[i] = io.error_response(f"vocoder decode failed: {error_text(exc)}; the sequence was ended: "
                                                 f"start it again with START", kind)
                if seq in self.sessions:
                    self.sessions.cancel(seq)
            return
        for seq, (i, _) in chunks.items():
            samples = audio[seq].float().numpy()[None]
            responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", samples)])

    def _slots(self):
        stats = self.sessions.stats()
        return {"active": stats.active_slots, "free": stats.free_slots}

    def _work(self):
        stats = self.sessions.stats()
        return {"executes": self.batch_sizes.num, "requests": int(self.batch_sizes.total),
                "execute_ms": int(self.execute_ms),
                **{name: getattr(stats, name) for name in WORK_STATS[3:]}}

    def finalize(self):
        self._stop.set()
        self._janitor.join(2.0)
        metrics.release_metrics()  # heartbeat and gauges: a metric alive after finalize crashes the stub
        self.sessions = None

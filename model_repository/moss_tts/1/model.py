"""moss_tts: TEXT [+ REFERENCE_AUDIO | REFERENCE_CODES, ...] -> AUDIO [2, samples] (48 kHz stereo)
and/or CODES [frames, 12], streamed (decoupled).

execute() validates every request (INVALID_ARG at once) and hands it to a stream thread (StreamPool;
beyond `max_streams` UNAVAILABLE at once); a STOP request is answered there (serving/stop_requests.py).
A stream (pipeline/speech_stream.SpeechStream) gets reference codes from ref_encoder (BLS), its code
chunks from the engine in this process (EngineCodes), vocodes them when AUDIO is wanted (in this
process, vocoder/worker.py, or the `vocoder` model over BLS), sends each chunk, and ends with one
final response. Requests naming a SESSION_ID form a text session (sessions/admission.py). This
adapter only wires and converts: the request policy is pipeline/speech_requests.py and
sessions/admission.py, a stream's Triton side serving/stream_io.py (docs/structure.md).
"""

import logging
import sys
import time

import torch
import triton_python_backend_utils as pb_utils

from moss_tts.codec.checkpoint import load_codec
from moss_tts.contract.errors import ErrorKind, ServingError
from moss_tts.contract.metrics import BATCH_SIZE_BUCKETS, STEP_MS_BUCKETS, stat_names
from moss_tts.contract.parameters import switch_interval_s
from moss_tts.engine.config import EngineConfig
from moss_tts.engine.engine import STREAM_PRIORITY, Engine
from moss_tts.engine.first_audio_gate import FirstAudioGate
from moss_tts.engine.stats import EngineStats
from moss_tts.model.loading import load_model, load_tokenizer
from moss_tts.model.processor import PromptBuilder
from moss_tts.pipeline.engine_streams import EngineStreams
from moss_tts.pipeline.first_audio_trace import TraceLog
from moss_tts.pipeline.speech_requests import SpeechRequests, requested_outputs
from moss_tts.pipeline.stream_ports import new_sequence_id
from moss_tts.pipeline.synthesis_request import parse_session_inputs
from moss_tts.serving import metrics, triton_io as io
from moss_tts.serving.gc_watch import GcStats, GcWatch
from moss_tts.serving.gpu_trace import GpuTrace
from moss_tts.serving.placement import checkpoint_dirs, resolve_device, resolve_dtype, use_device
from moss_tts.serving.request_ledger import LedgerStats, RequestLedger
from moss_tts.serving.stall_watch import StallWatch, oldest_of
from moss_tts.serving.stop_requests import StopRequests
from moss_tts.serving.stop_watch import ServerStopWatch
from moss_tts.serving.stream_io import FINAL, TritonChildren, TritonClient, encode_reference, end_sequence, refuse
from moss_tts.serving.stream_pool import StreamPool
from moss_tts.serving.thread_priority import give_threads_priority, rt_priorities
from moss_tts.sessions.admission import SessionAdmission
from moss_tts.sessions.claims import SessionClaims, server_directory
from moss_tts.sessions.registry import SessionConfig, SessionRegistry, SessionStats
from moss_tts.sessions.relay import RelayServer, socket_path
from moss_tts.vocoder import internal_key
from moss_tts.vocoder.config import VocoderConfig, VocoderPlacement
from moss_tts.vocoder.jobs import LoadHold
from moss_tts.vocoder.sessions import VocoderSessions
from moss_tts.vocoder.stats import WorkerStats
from moss_tts.vocoder.worker import VocoderWorker

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 10.0  # finalize: streams end at their next chunk or tick; Triton's exit timeout is 30 s
STATS = (*stat_names(EngineStats), "streams", "chunks_forwarded")  # the engine's, the streams held, vocoder_forward_chunks


class TritonPythonModel:
    def initialize(self, args):
        config, params = io.model_config(args), io.model_parameters(args)
        sys.setswitchinterval(switch_interval_s(params))
        priorities = rt_priorities(params)  # the engine's and the vocoder's threads (below)
        io.require_decoupled(config)
        instance, device_id = args["model_instance_name"], int(args["model_instance_device_id"])
        device = use_device(resolve_device(params.get("device"), device_id))
        model_dir, _ = checkpoint_dirs()
        dtype = resolve_dtype(params.get("dtype"), device)
        model = load_model(model_dir, device, dtype)
        builder = PromptBuilder(load_tokenizer(model_dir), model.cfg)
        engine_config = EngineConfig.from_parameters(params)
        max_streams = int(params.get("max_streams", "320"))
        # Before the engine: its KV budget counts what this process holds (the codec's state, graphs).
        placement = VocoderPlacement.from_parameters(params)
        session_config = SessionConfig.from_parameters(params)
        problem = session_config.vocoder_idle_problem(placement.vocoder_idle_s if placement.is_in_process else None)
        if problem:
            raise pb_utils.TritonModelException(problem)
        shared_stream = self._shared_stream(placement, device, device_id)  # vocoder_stream "engine"
        self.worker = self._vocoder_worker(placement, device, dtype, max_streams, device_id, shared_stream)
        # Light load: a new stream's first vocoder round runs before the engine's next step.
        gate = FirstAudioGate() if self.worker is not None and engine_config.first_audio_hold_rows else None
        if gate is not None:
            self.worker.first_audio_gate = gate
        self.streams = EngineStreams(lambda on_event: Engine(model, engine_config, on_event, gate, stream=shared_stream))
        self.streams.start()
        # The engine's and the vocoder's threads win the GIL back first (thread_priority.py; GPU only).
        for problem in give_threads_priority(priorities, device.type == "cuda", {
                "engine_rt_priority": self.streams.engine.thread,
                "vocoder_rt_priority": self.worker.thread if self.worker is not None else None}):
            log.warning("%s; the thread keeps its normal priority", problem)
        self.key = internal_key.internal_key()
        self.pool = StreamPool(max_streams, name=f"{instance}-stream")
        self.watch = StallWatch()  # the streams' BLS calls and sends
        self.sessions = SessionRegistry(session_config, self._end_sequence, new_sequence_id,
                                        claims=SessionClaims(server_directory(), instance))
        self.sessions.start_reaper()
        self.requests = SpeechRequests(
            self.streams, builder,
            lambda codes: TritonChildren(codes, self.key, self.watch, self.worker, self.pool.is_stopping),
            lambda audio: encode_reference(audio, self.watch), lambda record: self.metrics.observe(record),
            self.pool.is_stopping, TraceLog.from_env(), forward_chunks=placement.vocoder_forward_chunks)
        self.admission = SessionAdmission(self.requests, self.sessions, self.pool)
        relay_socket = socket_path(server_directory(), instance)
        # Requests in, final flags out: the model's view of what is in flight, beside Triton's.
        self.ledger = RequestLedger(FINAL)
        self.stops = StopRequests(self.ledger, relay_socket, self.watch, FINAL)  # in-band STOP requests
        # Session requests and STOPs that reached another instance of this server come here (sessions/relay.py).
        self.relay_server = RelayServer(relay_socket, self.admission.accept_relayed, self.stops.stop_from_peer)
        self.heartbeat = io.Heartbeat(args, lambda: oldest_of((self.streams.stalled_seconds(), "an engine step"),
            self.watch.oldest(), (self.worker.stalled_seconds() if self.worker else 0.0, "a vocoder round")))
        # One thread (the gauge thread) makes all of this model's metric IPC but the heartbeat's.
        self.metrics = metrics.RequestMetrics()
        self._start_gauges(instance)
        # The server's shutdown reaches the streams (in process nothing else would, until the exit timeout).
        self.stop_watch = ServerStopWatch(io.ask_missing_model, self._server_stopping)
        # Last: what is loaded now is never walked by a garbage collection again (gc_watch.py).
        log.info("moss_tts: %d objects frozen out of garbage collection", self.gc_watch.freeze_loaded())
        self.gc_watch.start()
        self.gpu_trace = GpuTrace.from_env()  # a served GPU timeline on request (perf/gpu_trace_budget.py)

    def _start_gauges(self, instance):
        self.ledger_gauges = metrics.Gauges(
            "moss_tts_requests", "moss_tts requests entered, final flags sent, in flight", stat_names(LedgerStats),
            lambda: vars(self.ledger.stats()), interval_s=0.5, instance=instance)
        self.session_gauges = metrics.Gauges(
            "moss_tts_sessions", "moss_tts text sessions (open now, and counters)", stat_names(SessionStats),
            lambda: vars(self.sessions.stats()), interval_s=0.5, instance=instance)
        self.histograms = {name: metrics.HistogramGauges(f"moss_engine_{name}", description, bounds, instance)
                           for name, description, bounds
                           in (("batch_size", "rows per engine step", BATCH_SIZE_BUCKETS),
                               ("step_ms", "milliseconds per engine step", STEP_MS_BUCKETS))}
        self.gauges = metrics.Gauges("moss_engine", "moss_tts engine counters and gauges", STATS, self._stats,
                                     after=self._flush_metrics, instance=instance)
        self.gc_watch = GcWatch()  # started once what is loaded is frozen (end of initialize)
        self.gc_gauges = metrics.Gauges("moss_tts_gc", "moss_tts stub's garbage collections: counts, pauses (ms)",
                                        stat_names(GcStats), lambda: vars(self.gc_watch.stats()), interval_s=0.5,
                                        instance=instance)
        self.vocoder_gauges = None
        if self.worker is not None:
            rows = metrics.HistogramGauges("moss_tts_vocoder_round_rows",
                                           "streams decoded per in-process vocoder round", BATCH_SIZE_BUCKETS, instance)
            self.vocoder_gauges = metrics.Gauges(
                "moss_tts_vocoder", "moss_tts in-process vocoder counters", stat_names(WorkerStats),
                lambda: vars(self.worker.stats()), interval_s=0.5, instance=instance,
                after=lambda: rows.set(self.worker.round_rows_histogram.cumulative()))

    @staticmethod
    def _shared_stream(placement, device, device_id):
        """vocoder_stream "engine" (in process, on the engine's GPU): the one CUDA stream both run on."""
        if not (placement.is_in_process and placement.vocoder_stream == "engine" and device.type == "cuda"):
            if placement.vocoder_stream == "engine":
                log.warning("vocoder_stream \"engine\" needs the vocoder in process on a GPU; each keeps its own stream")
            return None
        if resolve_device(placement.vocoder_device, device_id) != device:
            raise pb_utils.TritonModelException(
                f"vocoder_stream \"engine\" needs the vocoder on the engine's device ({device}); "
                f"vocoder_device is {placement.vocoder_device!r}")
        return torch.cuda.Stream(device, priority=STREAM_PRIORITY)

    @staticmethod
    def _vocoder_worker(placement, device, dtype, max_streams, device_id, stream=None):
        if not placement.is_in_process:
            return None
        codec_device = resolve_device(placement.vocoder_device, device_id)
        codec = load_codec(checkpoint_dirs()[1], codec_device, dtype, parts=("quantizer", "decoder")).eval()
        codec.serving_form_(*placement.codec_form)
        slots = placement.vocoder_slots or max_streams
        # Every slot is the pipeline's own; graphs are captured here (CUDA only).
        sessions = VocoderSessions(codec, VocoderConfig(
            max_slots=slots, max_public_sessions=slots, device=str(codec_device),
            dtype="bfloat16" if dtype == torch.bfloat16 else "float32", cuda_graphs=True,
            max_step_rows=placement.vocoder_step_rows))
        return VocoderWorker(sessions, idle_seconds=placement.vocoder_idle_s, round_rows=placement.vocoder_round_rows,
                             min_round_frames=placement.vocoder_round_min_frames,
                             hold_slack_s=placement.vocoder_hold_ms / 1000,
                             load_hold=LoadHold(placement.vocoder_load_streams, placement.vocoder_load_hold_ms / 1000),
                             stream=stream)

    def execute(self, requests):
        self.stop_watch.arm()  # the server serves: from now on "Server not ready" is its end
        for request in requests:
            sender = self.ledger.track(request.get_response_sender(), request.request_id())
            try:
                stream = self._prepare(request, sender)  # None: a STOP, answered
            except ServingError as exc:  # InvalidRequest, or UNAVAILABLE (max_sessions)
                self.ledger.classify(sender, "refused")
                refuse(sender, str(exc), exc.kind, self.watch)
                self.metrics.count("invalid" if exc.kind is ErrorKind.INVALID_ARGUMENT else "busy")
                continue
            if stream is not None and not self.admission.start(stream):
                self.ledger.classify(sender, "refused")
                self.metrics.count("busy" if not self.pool.is_stopping() else "unavailable")
                refuse(sender, self.pool.refusal(), ErrorKind.UNAVAILABLE, self.watch)
        return None

    def _prepare(self, request, sender):
        """The request's stream (a text session's request, a SpeechStream; None for a STOP): InvalidRequest at once."""
        started = time.monotonic()
        get = io.getter(request)
        if self.stops.answered(get, sender):
            return None
        session = parse_session_inputs(get)
        requested = requested_outputs(request.requested_output_names())
        client = TritonClient(sender, requested, self.watch)
        if session is not None:
            return self.admission.prepare(get, session, started, requested, request.request_id(), client,
                                          on_admit=lambda: self.ledger.classify(sender, "stream"), may_relay=True)
        stream, path = self.requests.stream(get, request.request_id(), requested, client, started)
        self.ledger.classify(sender, path)
        return stream

    def _end_sequence(self, sequence_id):
        end_sequence(self.worker, self.key, self.watch, sequence_id, self.pool.is_stopping)

    def _server_stopping(self):
        log.info("tritonserver is shutting down: %d streams end with UNAVAILABLE, new ones are refused",
                 self.pool.num_active)
        self.pool.begin_stop()

    def _stats(self):
        return {**vars(self.streams.engine.stats()), "streams": self.pool.num_active, "chunks_forwarded": self.streams.chunks_forwarded}

    def _flush_metrics(self):
        self.metrics.flush()
        for name, values in self.streams.engine.histograms().items():
            self.histograms[name].set(values)

    def finalize(self):
        self.gpu_trace.stop()  # first: a recording ends unwritten, CUPTI off before anything unloads
        # Running streams see is_stopping at their next chunk (or within a second while they
        # wait), abort, and answer UNAVAILABLE; then the engine stops.
        if not self.pool.stop(STOP_TIMEOUT_S):
            log.warning("%d streams still running at shutdown (blocked on a child?)", self.pool.num_active)
        self.relay_server.stop()
        self.sessions.stop()
        self.streams.shutdown(STOP_TIMEOUT_S)
        if self.requests.trace_log is not None:
            self.requests.trace_log.close()
        self.stop_watch.stop()
        if self.worker is not None:
            self.worker.stop(STOP_TIMEOUT_S)
        self.gc_watch.stop()
        # Last: the heartbeat, every gauge and request metric (a metric alive after finalize
        # crashes the stub at unload: serving/metrics.MetricHolder).
        metrics.release_metrics()

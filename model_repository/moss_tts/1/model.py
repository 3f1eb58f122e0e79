"""moss_tts: TEXT [+ REFERENCE_AUDIO | REFERENCE_CODES, ...] -> AUDIO [2, samples] (48 kHz stereo)
and/or CODES [frames, 12], streamed (decoupled).

execute() validates every request (INVALID_ARG at once) and hands it to a stream thread
(StreamPool; beyond `max_streams` UNAVAILABLE at once), then returns. A stream
(speech_pipeline.SpeechStream) gets reference codes from ref_encoder (BLS), its code chunks from
the engine in this process (EngineCodes), vocodes them when AUDIO is wanted, sends each chunk,
and ends with one final response. The vocoder runs in this process too (`vocoder` parameter
"in_process", vocoder_worker.VocoderWorker: chunks in flight per stream, batched across streams,
on a CUDA stream of its own), or in the `vocoder` model over BLS ("bls", for placements that put
the codec on another GPU). Requests naming a SESSION_ID form a text session
(sessions/registry.py, session_stream.py): run in order, one voice, one vocoder sequence.
BLS calls here are never decoupled: in 24.10 those corrupt the stub's
heap and deadlock it under concurrency (see docs/structure.md).
"""

import logging
import sys
import time
from dataclasses import replace

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from moss_tts.codec.checkpoint import load_codec
from moss_tts.contract.errors import ChildError, ErrorKind, InvalidRequest, ServingError
from moss_tts.contract.metrics import BATCH_SIZE_BUCKETS, STEP_MS_BUCKETS
from moss_tts.contract.parameters import switch_interval_s
from moss_tts.contract.tensors import MOSS_TTS_INPUTS, MOSS_TTS_OUTPUTS, N_VQ, SESSION_VOICE_INPUTS
from moss_tts.engine.config import EngineConfig
from moss_tts.engine.engine import Engine
from moss_tts.model.loading import load_model, load_tokenizer
from moss_tts.model.processor import PromptBuilder
from moss_tts.pipeline.engine_codes import EngineCodes
from moss_tts.pipeline.engine_streams import EngineStreams
from moss_tts.pipeline.segmented_codes import SegmentedCodes, codes_for
from moss_tts.pipeline.speech_stream import END_WAIT_S, NO_CODES, Ready, SpeechStream, new_sequence_id
from moss_tts.pipeline.synthesis_request import parse_session_inputs, parse_synthesis_request
from moss_tts.serving import metrics, triton_io as io
from moss_tts.serving.placement import checkpoint_dirs, resolve_device, resolve_dtype, use_device
from moss_tts.serving.request_ledger import PATHS as LEDGER_PATHS, RequestLedger
from moss_tts.serving.request_record import RecordingClient
from moss_tts.serving.stall_watch import StallWatch
from moss_tts.serving.stop_watch import ServerStopWatch
from moss_tts.serving.stream_pool import StreamPool
from moss_tts.sessions.claims import SessionClaims, SessionHeldElsewhere, server_directory
from moss_tts.sessions.registry import SESSION_STATS, SessionConfig, SessionRegistry
from moss_tts.sessions.relay import RelayedStream, RelayServer, message_getter, request_message, socket_path
from moss_tts.sessions.session_request import (NO_AUDIO, SessionChildren, SessionClient, SessionCodes, SessionRequest,
                                               first_reference)
from moss_tts.vocoder import internal_key
from moss_tts.vocoder.config import VocoderConfig, VocoderPlacement
from moss_tts.vocoder.sessions import VocoderSessions
from moss_tts.vocoder.worker import VocoderWorker

log = logging.getLogger(__name__)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
OUTPUTS = tuple(t.name for t in MOSS_TTS_OUTPUTS)
STOP_TIMEOUT_S = 10.0  # finalize: streams end at their next chunk or tick; Triton's exit timeout is 30 s
STATS = ("requests_admitted", "requests_finished", "requests_cancelled", "requests_failed", "steps",
         "max_batch_size_seen", "frames_generated", "running", "waiting", "free_slots",
         "decode_graph_hits", "decode_graph_fallbacks", "prefill_graph_hits", "prefill_graph_fallbacks",
         "prefix_prompt_rows", "prefix_reused_rows", "prefix_blocks_stored", "prefix_blocks_evicted",
         "prefix_pool_blocks_used", "step_host_ms", "step_wait_ms", "streams")
VOCODER_STATS = ("rounds", "jobs", "frames", "round_ms", "queued_jobs", "active_slots", "free_slots",
                 "sessions_started", "sessions_ended", "sessions_failed", "graph_calls", "decode_calls")
LEDGER_STATS = ("entered", "finals", "in_flight", "send_errors", "double_finals",
                *(f"in_flight_{path}" for path in LEDGER_PATHS))


def _call(request, output: str, watch: StallWatch) -> np.ndarray:
    """One non-decoupled BLS call, watched for stalls: its `output`, or ChildError."""
    with watch.working():
        response = request.exec()
    if response.has_error():
        raise ChildError.from_message(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, output).as_numpy()


def encode_reference(audio: bytes, watch: StallWatch) -> np.ndarray:
    """Reference file bytes -> codes [1, frames, 12], by ref_encoder over BLS (cached there)."""
    request = pb_utils.InferenceRequest(
        model_name="ref_encoder", inputs=[io.bytes_tensor("REFERENCE_AUDIO", [audio], [1, 1])],
        requested_output_names=["REFERENCE_CODES"])
    return _call(request, "REFERENCE_CODES", watch).copy()


def vocode_call(worker, parameters, watch: StallWatch, sequence_id: int, codes, start: bool, end: bool,
                on_done=lambda: None, deadline=None, is_stopping=lambda: False):
    """One call of a vocoder sequence: a job of this process's worker (its audio to come), or a
    call of the `vocoder` model over BLS with the pipeline's key `parameters` (answered: Ready)."""
    if worker is not None:
        return worker.submit(sequence_id, codes, start, end, on_done=on_done, deadline=deadline)
    if end and not start and not len(codes) and is_stopping():
        # The server stops: Triton refuses the END anyway (the vocoder's sequences end with it), and
        # a BLS call made after this instance's last final response can land as Triton finalizes
        # the instance, which crashes tritonserver 2.51 (serving/stop_watch.py).
        return Ready(NO_AUDIO)
    flags = (START if start else 0) | (END if end else 0)
    request = pb_utils.InferenceRequest(
        model_name="vocoder", correlation_id=sequence_id, flags=flags, parameters=parameters,
        inputs=[pb_utils.Tensor("CODES", np.ascontiguousarray(codes, dtype=np.int32)[None])],
        requested_output_names=["AUDIO"])
    return Ready(_call(request, "AUDIO", watch)[0])


class TritonChildren:
    """One stream's engine chunks and its vocoder sequence: in this process (`worker`), or the
    `vocoder` model over BLS with the pipeline's key (so it never meets the direct callers'
    quota). Every blocking BLS call is watched for stalls."""

    def __init__(self, codes: "EngineCodes | SegmentedCodes", key: str, watch: StallWatch,
                 worker: "VocoderWorker | None", is_stopping=lambda: False):
        self.codes = codes
        self.is_stopping = is_stopping
        self.parameters = internal_key.parameters(key)
        self.watch = watch
        self.worker = worker
        self.sequence_id = new_sequence_id()

    def stream_codes(self):
        return self.codes.chunks()

    def abort_codes(self):
        self.codes.abort()

    def vocode(self, codes, start, end, deadline=None):
        # The job's completion wakes this stream's wait for its next engine chunk.
        return vocode_call(self.worker, self.parameters, self.watch, self.sequence_id, codes, start, end,
                           on_done=self.codes.wake, deadline=deadline, is_stopping=self.is_stopping)


class TritonClient:
    """Sends exactly the outputs the client requested (the 24.10 stub prunes the others after
    releasing the GIL, freeing numpy arrays off the GIL)."""

    def __init__(self, sender, requested: set, watch: StallWatch):
        self.sender = sender
        self.requested = requested
        self.watch = watch

    def send(self, audio, codes, context, final):
        values = {"AUDIO": audio, "CODES": codes, "CONTEXT_CODES": context}
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in values.items()
                   if name in self.requested and value is not None]
        self._send(pb_utils.InferenceResponse(tensors), FINAL if final else 0)

    def send_error(self, message, kind):
        self._send(io.error_response(message, kind), FINAL)

    def send_final(self):
        self._send(None, FINAL)

    def _send(self, response, flags):
        with self.watch.working():
            if response is None:
                self.sender.send(flags=flags)
            else:
                self.sender.send(response, flags=flags)

    def is_cancelled(self):
        return self.sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        config, params = io.model_config(args), io.model_parameters(args)
        sys.setswitchinterval(switch_interval_s(params))
        io.require_decoupled(config)
        device = use_device(resolve_device(params.get("device"), int(args["model_instance_device_id"])))
        model_dir, _ = checkpoint_dirs()
        dtype = resolve_dtype(params.get("dtype"), device)
        model = load_model(model_dir, device, dtype)
        self.builder = PromptBuilder(load_tokenizer(model_dir), model.cfg)
        engine_config = EngineConfig.from_parameters(params)
        max_streams = int(params.get("max_streams", "320"))
        # Before the engine: its KV budget counts what this process already holds (the codec's
        # state and graphs among it).
        placement = VocoderPlacement.from_parameters(params)
        session_config = SessionConfig.from_parameters(params)
        if placement.is_in_process and session_config.session_idle_timeout_s >= placement.vocoder_idle_s:
            raise pb_utils.TritonModelException(
                f"session_idle_timeout_s ({session_config.session_idle_timeout_s:g}) must be below vocoder_idle_s "
                f"({placement.vocoder_idle_s:g}): the vocoder would end an idle session's sequence under it")
        self.worker = self._vocoder_worker(placement, device, dtype, max_streams, int(args["model_instance_device_id"]))
        self.streams = EngineStreams(lambda on_event: Engine(model, engine_config, on_event))
        self.streams.start()
        self.key = internal_key.internal_key()
        self.pool = StreamPool(max_streams, name=f"{args['model_instance_name']}-stream")
        self.watch = StallWatch()  # the streams' BLS calls and sends
        self.sessions = SessionRegistry(session_config, self._end_sequence, new_sequence_id,
                                        claims=SessionClaims(server_directory(), args["model_instance_name"]))
        self.sessions.start_reaper()
        # Session requests that reached another instance of this server come here to be spoken
        # (several instances: sessions/relay.py).
        self.relay_server = RelayServer(socket_path(server_directory(), args["model_instance_name"]),
                                        self._accept_relayed)
        self.heartbeat = io.Heartbeat(args, lambda: max(self.streams.stalled_seconds(), self.watch.stalled_seconds(),
                                                        self.worker.stalled_seconds() if self.worker else 0.0))
        # One thread (the gauge thread) makes all of this model's metric IPC but the heartbeat's.
        self.metrics = metrics.RequestMetrics()
        instance = args["model_instance_name"]
        # Requests in, final flags out: the model's view of what is in flight, beside Triton's.
        self.ledger = RequestLedger(FINAL)
        self.ledger_gauges = metrics.Gauges("moss_tts_requests", "moss_tts requests entered, final flags sent, in flight",
                                       LEDGER_STATS, lambda: vars(self.ledger.stats()), interval_s=0.5,
                                       instance=instance)
        self.session_gauges = metrics.Gauges("moss_tts_sessions", "moss_tts text sessions (open now, and counters)",
                                        SESSION_STATS, lambda: vars(self.sessions.stats()), interval_s=0.5,
                                        instance=instance)
        self.histograms = {name: metrics.HistogramGauges(f"moss_engine_{name}", description, bounds, instance)
                           for name, description, bounds
                           in (("batch_size", "rows per engine step", BATCH_SIZE_BUCKETS),
                               ("step_ms", "milliseconds per engine step", STEP_MS_BUCKETS))}
        self.gauges = metrics.Gauges("moss_engine", "moss_tts engine counters and gauges", STATS, self._stats,
                                after=self._flush_metrics, instance=instance)
        # The server's shutdown reaches the streams: over BLS a refused call said so, in process
        # nothing does (streams would run on until Triton's exit timeout).
        self.stop_watch = ServerStopWatch(io.ask_missing_model, self._server_stopping)
        self.vocoder_gauges = None
        if self.worker is not None:
            rows = metrics.HistogramGauges("moss_tts_vocoder_round_rows", "streams decoded per in-process vocoder round",
                                      BATCH_SIZE_BUCKETS, instance)
            self.vocoder_gauges = metrics.Gauges(
                "moss_tts_vocoder", "moss_tts in-process vocoder counters", VOCODER_STATS,
                lambda: vars(self.worker.stats()), interval_s=0.5, instance=instance,
                after=lambda: rows.set(self.worker.round_rows_histogram.cumulative()))

    @staticmethod
    def _vocoder_worker(placement, device, dtype, max_streams, device_id):
        if not placement.is_in_process:
            return None
        codec_device = resolve_device(placement.vocoder_device, device_id)
        codec = load_codec(checkpoint_dirs()[1], codec_device, dtype, parts=("quantizer", "decoder")).eval()
        codec.serving_form_()  # LayerScale in the GEMMs, weight norm computed once
        slots = placement.vocoder_slots or max_streams
        # Every slot is the pipeline's own; graphs are captured here (CUDA only).
        sessions = VocoderSessions(codec, VocoderConfig(
            max_slots=slots, max_public_sessions=slots, device=str(codec_device),
            dtype="bfloat16" if dtype == torch.bfloat16 else "float32", cuda_graphs=True,
            max_step_rows=placement.vocoder_step_rows))
        return VocoderWorker(sessions, idle_seconds=placement.vocoder_idle_s, round_rows=placement.vocoder_round_rows)

    def execute(self, requests):
        self.stop_watch.arm()  # the server serves: from now on "Server not ready" is its end
        for request in requests:
            sender = self.ledger.track(request.get_response_sender())
            try:
                stream = self._prepare(request, sender)
            except ServingError as exc:  # InvalidRequest, or UNAVAILABLE (max_sessions)
                self.ledger.classify(sender, "refused")
                sender.send(io.error_response(str(exc), exc.kind), flags=FINAL)
                self.metrics.count("invalid" if exc.kind is ErrorKind.INVALID_ARGUMENT else "busy")
                continue
            if not self.pool.try_start(stream.run):
                if isinstance(stream, SessionRequest):  # its turn never comes: the session closes
                    self.sessions.finish(stream.session, "failed")
                self.ledger.classify(sender, "refused")
                self.metrics.count("busy" if not self.pool.is_stopping() else "unavailable")
                sender.send(io.error_response(self.pool.refusal(), ErrorKind.UNAVAILABLE), flags=FINAL)
        return None

    def _prepare(self, request, sender):
        started = time.monotonic()
        get = io.getter(request)
        session = parse_session_inputs(get)
        if session is not None:
            requested = set(request.requested_output_names()) or set(OUTPUTS)
            return self._prepare_session(get, session, started, requested, request.request_id(),
                                         TritonClient(sender, requested, self.watch),
                                         on_admit=lambda: self.ledger.classify(sender, "stream"), may_relay=True)
        synthesis = self._synthesis(request.request_id(), get)
        reference = self._reference(get, synthesis)
        requested = set(request.requested_output_names()) or set(OUTPUTS)
        codes = codes_for(self.streams, self.builder, synthesis, reference)  # long text: one request per segment
        self.ledger.classify(sender, "long_form" if isinstance(codes, SegmentedCodes) else
                             "codes" if "AUDIO" not in requested else "stream" if synthesis.stream else "offline")
        children = TritonChildren(codes, self.key, self.watch, self.worker, self.pool.is_stopping)
        client = RecordingClient(TritonClient(sender, requested, self.watch), self.metrics.observe, started)
        return SpeechStream(children, client, synthesis.stream, "AUDIO" in requested, self.pool.is_stopping)

    def _reference(self, get, synthesis):
        """The request's reference codes, as a callable the stream thread runs (ref_encoder over BLS)."""
        # Copies: the stream outlives execute(), and with it the request's input buffers.
        audio = get("REFERENCE_AUDIO")
        audio = b"" if audio is None else bytes(audio.reshape(-1)[0])
        given = get("REFERENCE_CODES")
        given = None if given is None else np.array(given, dtype=np.int32).reshape(-1, N_VQ)
        if audio and given is not None and given.size:
            raise InvalidRequest("send REFERENCE_AUDIO or REFERENCE_CODES, not both")
        if synthesis.mode == "continuation" and not audio and (given is None or not given.size):
            raise InvalidRequest("MODE=continuation needs REFERENCE_AUDIO (or REFERENCE_CODES): the audio to continue")
        return (lambda: encode_reference(audio, self.watch)) if audio else (lambda: given)

    @staticmethod
    def _synthesis(request_id, get):
        synthesis = parse_synthesis_request(get, "")
        # Client request ids repeat across clients ("1", ...): the engine id is made unique.
        return synthesis.with_request_id(f"{synthesis.request_id or request_id or 'req'}-{new_sequence_id():x}")

    def _prepare_session(self, get, inputs, started, requested, request_id, client, on_admit, may_relay):
        """One request of a text session (sessions/registry.py): checked here, run in order.
        `client`: the request's (TritonClient, or a RelayClient when it came from another instance);
        a request for a session another instance holds is relayed there if `may_relay`."""
        synthesis = self._synthesis(request_id, get) if inputs.has_text else None
        if "AUDIO" not in requested:
            raise InvalidRequest("a text session streams audio: request AUDIO (CODES may come with it)")
        if synthesis is not None and (not synthesis.stream or synthesis.fields.tokens is not None):
            raise InvalidRequest("a text session streams each segment: drop STREAM=false and TOKENS")
        voice_inputs = [name for name in SESSION_VOICE_INPUTS if get(name) is not None]
        is_later = inputs.index != 0 if inputs.index is not None else self.sessions.is_open(inputs.session_id)
        if voice_inputs and is_later:
            raise InvalidRequest(f"{', '.join(voice_inputs)}: the voice of text session {inputs.session_id!r} is "
                                 f"set by its first request; send these only there")
        reference = self._reference(get, synthesis) if synthesis is not None else (lambda: None)
        try:
            session, ticket, _ = self._join(inputs)
        except SessionHeldElsewhere as held:
            if not may_relay or not held.owner:  # relayed once already; or its holder never said
                raise
            on_admit()
            self.sessions.count_relayed()
            inputs_sent = {t.name: value for t in MOSS_TTS_INPUTS if (value := get(t.name)) is not None}
            message = request_message(inputs_sent, sorted(requested), request_id or "")
            return RelayedStream(socket_path(server_directory(), held.owner), message, client, self.pool.is_stopping)
        try:
            on_admit()
            return self._session_request(client, synthesis, reference, inputs, session, ticket, started)
        except BaseException:  # the ticket must be given back, or the session's later requests wait forever
            self.sessions.finish(session, "failed")
            raise

    def _join(self, inputs):
        """sessions.join; a claim whose holder has not written its name yet (it opens the session
        this moment) is read again for a short while."""
        for _ in range(50):
            try:
                return self.sessions.join(inputs.session_id, inputs.is_end, inputs.has_text, inputs.index)
            except SessionHeldElsewhere as held:
                if held.owner:
                    raise
                time.sleep(0.01)
        return self.sessions.join(inputs.session_id, inputs.is_end, inputs.has_text, inputs.index)

    def _session_request(self, base_client, synthesis, reference, inputs, session, ticket, started):
        on_final = (lambda: self.sessions.close(session, "ended")) if inputs.is_end else (lambda: None)
        client = SessionClient(RecordingClient(base_client, self.metrics.observe, started), on_final)
        stream = None
        is_first = ticket == 0  # the session's first request: its reference, or its first frames, is the voice
        if synthesis is not None:
            if is_first:
                codes = codes_for(self.streams, self.builder, synthesis, first_reference(session, reference))
            else:
                codes = codes_for(self.streams, self.builder, replace(synthesis, mode="clone"), session.voice_codes)
            children = TritonChildren(SessionCodes(codes, session, is_first), self.key, self.watch, self.worker,
                                      self.pool.is_stopping)
            children.sequence_id = session.sequence_id
            stream = SpeechStream(SessionChildren(children, session, inputs.is_end, client), client, True, True,
                                  self.pool.is_stopping)
        return SessionRequest(self.sessions, session, ticket, stream, client, self.pool.is_stopping)

    def _accept_relayed(self, message, client):
        """A session request relayed from another instance of this server (session_relay.RelayServer)."""
        started = time.monotonic()
        try:
            get = message_getter(message)
            inputs = parse_session_inputs(get)
            if inputs is None:
                raise InvalidRequest("a relayed request must name a SESSION_ID")
            requested = set(message["requested"]) or set(OUTPUTS)
            stream = self._prepare_session(get, inputs, started, requested, message["request_id"], client,
                                           on_admit=lambda: None, may_relay=False)
        except ServingError as exc:
            client.send_error(str(exc), exc.kind)
            return
        if not self.pool.try_start(stream.run):
            self.sessions.finish(stream.session, "failed")
            client.send_error(self.pool.refusal(), ErrorKind.UNAVAILABLE)

    def _end_sequence(self, sequence_id):
        """End a text session's vocoder sequence (closed by SESSION_END, cancel, failure or timeout)."""
        try:
            vocode_call(self.worker, internal_key.parameters(self.key), self.watch, sequence_id, NO_CODES,
                        start=False, end=True, is_stopping=self.pool.is_stopping).result(timeout=END_WAIT_S)
        except Exception as exc:  # the vocoder's own idle timeout reclaims the sequence
            log.warning("ending text session sequence %x failed: %s", sequence_id, exc)

    def _server_stopping(self):
        log.info("tritonserver is shutting down: %d streams end with UNAVAILABLE, new ones are refused",
                 self.pool.num_active)
        self.pool.begin_stop()

    def _stats(self):
        stats = self.streams.engine.stats()
        return {name: self.pool.num_active if name == "streams" else getattr(stats, name) for name in STATS}

    def _flush_metrics(self):
        self.metrics.flush()
        for name, values in self.streams.engine.histograms().items():
            self.histograms[name].set(values)

    def finalize(self):
        # Running streams see is_stopping at their next chunk (or within a second while they
        # wait), abort, and answer UNAVAILABLE; then the engine stops.
        if not self.pool.stop(STOP_TIMEOUT_S):
            log.warning("%d streams still running at shutdown (blocked on a child?)", self.pool.num_active)
        self.relay_server.stop()
        self.sessions.stop()
        self.streams.shutdown(STOP_TIMEOUT_S)
        self.stop_watch.stop()
        if self.worker is not None:
            self.worker.stop(STOP_TIMEOUT_S)
        # Last: the heartbeat, every gauge and request metric (a metric alive after finalize
        # crashes the stub at unload: serving/metrics.MetricHolder).
        metrics.release_metrics()

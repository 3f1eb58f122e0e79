"""tts_engine: text (+ reference codes) -> streamed CODES [frames, 12] (int32), decoupled.

execute() validates, builds the prompt rows and hands the request to the continuous-batching
engine thread, then returns. A response thread sends each chunk of codes as it is produced,
then exactly one final response (an error response for a failure, CANCELLED for a cancel).
Inputs: see config.pbtxt; ABORT=true with REQUEST_ID cancels a request in flight (the moss_tts
entry uses it because 24.10 cannot cancel a BLS child).
"""

import threading
import uuid

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from moss_tts.engine.config import EngineConfig
from moss_tts.engine.engine import Engine
from moss_tts.engine.request import EngineRequest
from moss_tts.engine.scheduler import QueueFull
from moss_tts.loading import load_model, load_tokenizer
from moss_tts.processor import PromptBuilder, PromptError
from moss_tts.serving import triton_io as io
from moss_tts.serving.engine_frontend import EngineFrontend
from moss_tts.serving.placement import checkpoint_dirs, resolve_device, resolve_dtype
from moss_tts.serving.synthesis_request import RequestError, parse_synthesis_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
STATS = ("requests_admitted", "requests_finished", "requests_cancelled", "requests_failed", "steps",
         "max_batch_size_seen", "frames_generated", "running", "waiting", "free_slots",
         "decode_graph_hits", "decode_graph_fallbacks", "prefill_graph_hits", "prefill_graph_fallbacks",
         "prefix_prompt_rows", "prefix_reused_rows", "prefix_blocks_stored", "prefix_blocks_evicted",
         "prefix_pool_blocks_used", "step_host_ms", "step_wait_ms")


class TritonSender:
    def __init__(self, sender):
        self.sender = sender

    def send_codes(self, codes, context):
        ctx = np.zeros((0, 12), np.int32) if context is None else context.numpy().astype(np.int32)
        self.sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("CODES", codes.numpy().astype(np.int32)), pb_utils.Tensor("CONTEXT_CODES", ctx)]))

    def send_final(self, error, code):
        if error is None:
            self.sender.send(flags=FINAL)
        else:
            self.sender.send(io.error_response(error, code), flags=FINAL)

    def is_cancelled(self):
        return self.sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        config, params = io.model_config(args), io.model_parameters(args)
        io.require_decoupled(config)
        device = resolve_device(params.get("device"), int(args["model_instance_device_id"]))
        dtype = resolve_dtype(params.get("dtype"), device)
        model_dir, _ = checkpoint_dirs()
        model = load_model(model_dir, device, dtype)
        self.builder = PromptBuilder(load_tokenizer(model_dir), model.cfg)
        engine_config = EngineConfig.from_parameters(params)
        self.frontend = EngineFrontend(lambda on_event: Engine(model, engine_config, on_event))
        self.frontend.start()
        # The family must outlive its metrics, so it is kept on the instance.
        self.family = pb_utils.MetricFamily("moss_engine", "tts_engine counters and gauges",
                                            pb_utils.MetricFamily.GAUGE)
        self.metrics = {name: self.family.Metric(labels={"stat": name}) for name in STATS}
        self._metrics_stop = threading.Event()
        self._metrics_thread = threading.Thread(target=self._publish_metrics, daemon=True)
        self._metrics_thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except (RequestError, PromptError, ValueError) as exc:
                sender.send(io.error_response(str(exc)), flags=FINAL)
            except QueueFull as exc:
                sender.send(io.error_response(f"server busy: {exc}", io.UNAVAILABLE), flags=FINAL)
        return None

    def _submit(self, request, sender):
        get = io.getter(request)
        if bool((get("ABORT") if get("ABORT") is not None else np.zeros(1, bool)).reshape(-1)[0]):
            rid = bytes(get("REQUEST_ID").reshape(-1)[0]).decode() if get("REQUEST_ID") is not None else ""
            if not rid:
                raise RequestError("ABORT needs the REQUEST_ID of the request to cancel")
            self.frontend.abort(rid)
            sender.send(flags=FINAL)
            return
        # Client request ids repeat across clients ("1"...): without an explicit REQUEST_ID the
        # engine id gets a unique suffix; an explicit REQUEST_ID is used as given (for ABORT).
        req = parse_synthesis_request(get, f"{request.request_id() or 'req'}-{uuid.uuid4().hex[:12]}")
        ref = get("REFERENCE_CODES")
        ref = None if ref is None or ref.size == 0 else torch.from_numpy(ref.reshape(-1, 12).astype(np.int64))
        rows = self.builder.build(req.prompt_spec(ref))
        engine_request = EngineRequest(req.request_id, rows, req.params, req.first_chunk_frames, req.chunk_frames)
        context = ref if req.mode == "continuation" else None
        self.frontend.submit(engine_request, TritonSender(sender), context)

    def _publish_metrics(self):
        # Gauges are refreshed a few times a second, off the hot path.
        while not self._metrics_stop.wait(0.25):
            stats = self.frontend.engine.stats()
            for name, metric in self.metrics.items():
                metric.set(getattr(stats, name))

    def finalize(self):
        self._metrics_stop.set()
        self.frontend.shutdown()

"""BLS calls from a stub thread while Triton finalizes the instance (perf/finalize_repro/README.md)."""

import json
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.probe_s = float(params.get("PROBE_MS", "50")) / 1000
        self.finalize_s = float(params.get("FINALIZE_S", "2"))
        # moss_tts's ServerStopWatch: probe only once the model served a request, and stop at the
        # first "Server not ready" (from then on it means the server stops).
        self.armed = threading.Event()
        if params.get("ARMED_BY_REQUEST", "0") != "1":
            self.armed.set()
        self.stop_at_not_ready = params.get("STOP_AT_NOT_READY", "0") == "1"
        self.stop = threading.Event()
        self.answers = []  # (time, message) of every probe answer, logged at the end of finalize
        self.thread = threading.Thread(target=self.probe, daemon=True)
        self.thread.start()
        # Threads that run Python code (moss_tts: engine loop, stream threads, gauges): the stub's
        # main thread must win the GIL from them before it can mark itself finalizing.
        for _ in range(int(params.get("BUSY_THREADS", "0"))):
            threading.Thread(target=self.spin, daemon=True).start()

    def spin(self):
        while not self.stop.is_set():
            sum(range(1000))

    def probe(self):
        while not self.stop.is_set() and not self.armed.wait(self.probe_s):
            pass
        while not self.stop.wait(self.probe_s):
            try:
                response = pb_utils.InferenceRequest(model_name="no_such_model", inputs=[],
                                                     requested_output_names=[]).exec()
                message = response.error().message() if response.has_error() else "ok"
            except Exception as exc:
                message = f"raised {exc}"
            self.answers.append((time.time(), message))
            if self.stop_at_not_ready and "Server not ready" in message:
                return

    def execute(self, requests):
        self.armed.set()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]

    def finalize(self):
        self.finalize_t = time.time()
        pb_utils.Logger.log_info("finalize: begins")
        time.sleep(self.finalize_s)  # moss_tts's finalize takes 1-4 s (streams, engine, threads)
        self.stop.set()
        self.thread.join(1.0)
        during = [m for t, m in self.answers if t >= self.finalize_t]
        pb_utils.Logger.log_info(f"finalize: ends, probe thread alive={self.thread.is_alive()}, "
                                 f"{len(during)} answers during finalize, last: {during[-1:]}; "
                                 f"before it: {[m for t, m in self.answers if t < self.finalize_t][-1:]}")

"""CHUNKS responses GAP_MS apart on a thread of its own, then FINAL (CHUNKS 0: FINAL alone after
GAP_MS). See config.pbtxt."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _out(i: int):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))])


def _run(sender, chunks: int, gap_s: float, final_with_data: bool, stop_on_cancel: bool) -> None:
    for i in range(chunks):
        time.sleep(gap_s)
        if stop_on_cancel and sender.is_cancelled():
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        is_last = i == chunks - 1
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if is_last and final_with_data else 0
        sender.send(_out(i), flags=flags)
    if chunks == 0:
        time.sleep(gap_s)
    if chunks == 0 or not final_with_data:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            def value(name, default=None):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return default if tensor is None else tensor.as_numpy()[0]
            threading.Thread(target=_run, daemon=True,
                             args=(request.get_response_sender(), int(value("CHUNKS")),
                                   int(value("GAP_MS")) / 1000, bool(value("FINAL_WITH_DATA")),
                                   bool(value("STOP_ON_CANCEL", False)))).start()
        return None

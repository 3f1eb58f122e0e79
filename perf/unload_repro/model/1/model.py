"""One custom metric, and nothing else (repro.py, README.md)."""

import faulthandler
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.keep = params["KEEP"]
        if params.get("FAULTHANDLER") == "1":
            faulthandler.enable()
        self.family = pb_utils.MetricFamily("repro_counter", "a counter", pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"model": args["model_name"]})
        self.metric.increment(1)

    def execute(self, requests):
        self.metric.increment(1)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]

    def finalize(self):
        if self.keep == "nothing":
            del self.metric  # a metric before its family: the family must outlive it
            del self.family

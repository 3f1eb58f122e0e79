"""Triton's per-model statistics for one run: what each model did between two snapshots
(requests, executions = batches, average batch, queue and compute time per request), as the
CosyVoice Triton client prints them. Used by `client.speak --stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tritonclient.grpc as grpcclient

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ModelDelta:
    model: str
    requests: int  # successful inference requests
    failed: int
    executions: int  # model executions (a batch is one)
    stage_ms: dict  # stage -> milliseconds per successful request

    @property
    def average_batch(self) -> float:
        return self.requests / self.executions if self.executions else 0.0


def snapshot(url: str) -> dict:
    """{model: its statistics as Triton's JSON} for every loaded model."""
    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(as_json=True)
    finally:
        client.close()
    return {m["name"]: m for m in stats.get("model_stats", [])}


def deltas(before: dict, after: dict) -> list[ModelDelta]:
    """The models that did something between the two snapshots, in name order."""
    rows = []
    for name in sorted(after):
        a, b = after[name], before.get(name, {})
        success = _count(a, "success") - _count(b, "success")
        failed = _count(a, "fail") - _count(b, "fail")
        executions = int(a.get("execution_count", 0)) - int(b.get("execution_count", 0))
        if not (success or failed or executions):
            continue
        stage_ms = {stage: (_ns(a, stage) - _ns(b, stage)) / 1e6 / success if success else 0.0 for stage in STAGES}
        rows.append(ModelDelta(name, success, failed, executions, stage_ms))
    return rows


def table(rows: list[ModelDelta]) -> str:
    head = f"{'model':<16}{'requests':>9}{'failed':>7}{'batches':>8}{'avg batch':>10}" + "".join(
        f"{stage + ' ms':>18}" for stage in STAGES)
    lines = [head]
    for r in rows:
        lines.append(f"{r.model:<16}{r.requests:>9}{r.failed:>7}{r.executions:>8}{r.average_batch:>10.2f}" + "".join(
            f"{r.stage_ms[stage]:>18.2f}" for stage in STAGES))
    return "\n".join(lines)


def _count(model: dict, stage: str) -> int:
    return int(model.get("inference_stats", {}).get(stage, {}).get("count", 0))


def _ns(model: dict, stage: str) -> int:
    return int(model.get("inference_stats", {}).get(stage, {}).get("ns", 0))

"""client.model_stats: what each model did between two statistics snapshots."""

from client.model_stats import deltas, table


def stats(success, executions, queue_ns):
    return {"inference_stats": {"success": {"count": success, "ns": 0}, "fail": {"count": 0, "ns": 0},
                                "queue": {"count": success, "ns": queue_ns}},
            "execution_count": executions}


def test_only_models_that_worked_are_listed_with_per_request_times():
    before = {"vocoder": stats(10, 5, 1_000_000), "ref_encoder": stats(3, 3, 0)}
    after = {"vocoder": stats(14, 6, 9_000_000), "ref_encoder": stats(3, 3, 0)}
    (row,) = deltas(before, after)
    assert (row.model, row.requests, row.executions, row.average_batch) == ("vocoder", 4, 1, 4.0)
    assert row.stage_ms["queue"] == 2.0  # 8 ms over 4 requests
    assert "vocoder" in table([row]) and "queue ms" in table([row])

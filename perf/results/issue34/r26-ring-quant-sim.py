"""Round 26, CPU experiment (dev box, no GPU): what storing the codec's attention rings in fewer
bytes would do to the streamed audio, with everything else in fp32. An fp8 or int8 ring is the lever
round 25's profile left for the codec's attention (at served round sizes it reads its rings near
the HBM rate); before building one, how far does each rule move the audio?

The real-size random codec in fp32 decodes 4 rows of 24 frames in chunks of 2, 4, 8, 10 frames
(decode_step, the torch reference path). After every step each ring is replaced by its stored form
under one rule (quantizing a stored value again is the identity for every rule here, so this is a
write-time rounding of each new key and value); the chunk's own keys are used exact, as a kernel
would use them. That is an experiment's monkeypatch of the state, not a served path. Rules:
- bf16 (what the served codec's rings hold, in a bf16 model);
- fp8_e4m3: the engine's fp8 rule (clamp +-448, round to e4m3);
- int8: the engine's int8 rule, a scale per (position, head) vector of head_dim.
Reported: each rule's audio against the exact fp32 ring's: SNR (dB, worst and mean row) and the
worst max |diff| / peak. For scale: bench_vocoder --fidelity's served bf16 codec against fp32.

    PYTHONPATH=python_backends:tests:. python3 perf/results/issue34/r26-ring-quant-sim.py [OUT.json]
"""
import json
import math
import sys
import time

import torch

from moss_tts.codec import build_real_size_codec
from moss_tts.kernels import kv_format

torch.set_num_threads(2)
t0 = time.time()
codec = build_real_size_codec("cpu", torch.float32).eval()
print("built", round(time.time() - t0), "s", flush=True)
ROWS, CHUNKS, N_VQ = 4, (2, 4, 8, 10), 12
gen = torch.Generator().manual_seed(5)
codes = torch.randint(0, codec.codebook_size, (ROWS, sum(CHUNKS), N_VQ), generator=gen)


def bf16(x):
    return x.to(torch.bfloat16).float()


def fp8(x):
    return kv_format.round_trip(x, torch.float8_e4m3fn)


def int8(x):
    return kv_format.round_trip(x, torch.int8)


def stream(rule) -> torch.Tensor:
    state = codec.new_decode_state(ROWS, "cpu")
    audio, start = [], 0
    with torch.no_grad():
        for n in CHUNKS:
            audio.append(codec.decode_step(codes[:, start:start + n], state))
            start += n
            if rule is not None:
                for cache in state.caches:
                    cache.copy_(rule(cache))
    return torch.cat(audio, dim=-1)


exact = stream(None)
print("exact", tuple(exact.shape), round(time.time() - t0), "s", flush=True)
results = {"rows": ROWS, "chunks": CHUNKS, "rules": {}}
for name, rule in (("bf16", bf16), ("fp8_e4m3", fp8), ("int8", int8)):
    got = stream(rule)
    error = got - exact
    snr = [10 * math.log10(exact[i].square().sum().item() / max(error[i].square().sum().item(), 1e-30))
           for i in range(ROWS)]
    rel = max(((error[i].abs().max()) / exact[i].abs().max()).item() for i in range(ROWS))
    results["rules"][name] = {"snr_db_min": min(snr), "snr_db_mean": sum(snr) / ROWS, "max_rel_diff": rel}
    print(f"{name:9s} SNR worst {min(snr):6.2f} dB, mean {sum(snr) / ROWS:6.2f} dB; max |diff| / peak {rel:.4f}",
          round(time.time() - t0), "s", flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump(results, fh, indent=2)

"""Serving components that sit between the Triton adapters and the model code.

Nothing here imports Triton except `triton_io`: every class is driven by plain tensors and
bytes, so the behaviour (caching, single-flight, per-stream vocoder slots, stream capacity) is
tested on CPU with pytest. The package itself imports nothing, so the torch-free `moss_tts`
entry can import its modules without loading torch.
"""

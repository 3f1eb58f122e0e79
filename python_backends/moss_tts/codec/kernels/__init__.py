"""Kernels of the codec, apart from its modules (policy-free, each with a torch reference)."""

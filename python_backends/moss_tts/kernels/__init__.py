"""Kernels: every Triton kernel of the package with the torch reference that CPUs run and tests
compare against, their shared set-up, the fused pointwise chains, and host-to-device copies that
never wait. No policy."""

"""Clients of the moss-tts-triton server (tritonclient gRPC streaming)."""

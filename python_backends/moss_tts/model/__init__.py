"""The MOSS-TTS-Local model in PyTorch: config, checkpoint loading, the Qwen3 backbone, the local
transformer, sampling, the prompt processor and the eager reference loop."""

"""Pipecat TTS service for MOSS-TTS served by Triton (docs/voice_agents.md)."""

from .tts import MossTTSService

__version__ = "0.1.0"
__all__ = ["MossTTSService", "__version__"]

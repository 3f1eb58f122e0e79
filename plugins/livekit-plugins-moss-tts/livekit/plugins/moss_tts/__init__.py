"""LiveKit Agents TTS for MOSS-TTS served by Triton (docs/voice_agents.md)."""

from livekit.agents import Plugin

from .log import logger
from .tts import TTS, ChunkedStream, SynthesizeStream

__version__ = "0.1.0"
__all__ = ["TTS", "ChunkedStream", "SynthesizeStream", "__version__"]


class MossTTSPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(MossTTSPlugin())

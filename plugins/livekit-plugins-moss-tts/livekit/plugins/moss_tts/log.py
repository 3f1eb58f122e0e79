import logging

logger = logging.getLogger("livekit.plugins.moss_tts")

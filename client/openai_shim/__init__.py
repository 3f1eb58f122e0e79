"""OpenAI-compatible speech API (`POST /v1/audio/speech`) in front of tritonserver's `moss_tts`.

config.py (settings) -> app.py (FastAPI) -> schema.py (request body) + references.py (reference
audio) -> triton_stream.py (gRPC streaming) -> audio_format.py (response bytes); errors.py maps
every failure to OpenAI's error JSON.
"""

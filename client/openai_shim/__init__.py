"""OpenAI-compatible speech API (`POST /v1/audio/speech`) in front of tritonserver's `moss_tts`.

config.py (settings) -> app.py (FastAPI) -> schema.py (request body) + references.py (reference
audio) -> triton_stream.py (gRPC streaming) -> audio_output.py (response bytes: audio_format.py
says what a response carries, audio_convert.py resamples and downmixes, audio_encode.py encodes,
each chunk as it comes); errors.py maps every failure to OpenAI's error JSON.
"""

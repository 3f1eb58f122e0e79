"""MOSS-TTS-Local-Transformer-v1.5 and MOSS-Audio-Tokenizer-v2, re-implemented for serving.

The model code here is our own; it loads the published Hugging Face checkpoints by their
real tensor names and never runs remote code.
"""

"""The vocoder: streaming codec decode of many sequences at once (slots of one batched state, CUDA
graphs), in the moss_tts process (worker) or as the vocoder model. No Triton import."""

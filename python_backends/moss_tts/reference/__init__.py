"""Reference audio -> codes (the ref_encoder model): decoding and loudness, the codec's encoder,
a content-addressed cache. No Triton import."""

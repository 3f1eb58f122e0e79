"""One utterance through the stages: its inputs parsed, its reference, its code chunks from the
engine (one request, or one per segment of a long text), vocoded and sent (SpeechStream). No Triton import."""

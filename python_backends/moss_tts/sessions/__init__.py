"""Text sessions: the requests of one SESSION_ID admitted, run in order with one voice and one
vocoder sequence, and relayed to the instance that holds the session. No Triton import."""

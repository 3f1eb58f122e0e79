"""What crosses the wire, torch-free and Triton-free: every model's tensors, limits and error kinds,
the sampling options, prompt fields, text segments, session requests and pbtxt parameters.
Clients import this layer; it imports nothing else of the package."""

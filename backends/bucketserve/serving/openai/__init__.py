"""OpenAI-compatible front end: its own process, talking to Triton over gRPC streaming."""

"""The public HTTP front: one process in front of Triton (guard, generate over gRPC, health, metrics)."""

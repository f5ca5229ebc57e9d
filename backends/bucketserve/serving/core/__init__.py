"""Triton-free cores of the serving models (unit-tested without Triton)."""

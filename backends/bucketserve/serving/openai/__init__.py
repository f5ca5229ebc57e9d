"""The OpenAI-compatible routes of the HTTP edge (mounted at /v1 by serving/front/app.py)."""

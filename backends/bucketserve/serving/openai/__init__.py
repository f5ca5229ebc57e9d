"""The OpenAI-compatible routes of the HTTP edge (mounted at /v1 by serving/front/app.py).

Our own, over gRPC: Triton's OpenAI front end is not on PyPI and cannot front our server
(docs/platform-notes.md#p16-what-pypi-offers).
"""

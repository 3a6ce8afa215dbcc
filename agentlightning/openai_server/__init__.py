"""One OpenAI-shaped HTTP server (`app.py`) for every model the package serves: the torch
engine (`torch_backend/openai_backend.py`) and the test doubles (`tests/fakes/`), each a
`ModelBackend` (`backend.py`). `requests.py` validates OpenAI's requests; `shapes.py` holds
the answer parts they build alike (error body, usage, SSE framing).

A base-layer package: it imports nothing of the package outside itself.
"""

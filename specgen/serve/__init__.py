"""`specgen serve`: an OpenAI-compatible HTTP server over one loaded session (requests.py parses,
worker.py decodes one request at a time, app.py routes and shapes the responses)."""

"""lookahead serve: an OpenAI-compatible server over one continuous-batching decode loop.

``engine.py`` owns the model (one decode thread; requests join and leave the running batch);
``app.py`` is the HTTP face (FastAPI: /v1/chat/completions, /v1/completions, /v1/models, /health,
/metrics), ``schemas.py`` what it reads and the errors it answers, ``text.py`` a reply's text from its
tokens. Importing this package imports neither FastAPI nor the engine: ``lookahead.serve.app`` needs
the ``[serve]`` extra.
"""

"""The serving path: one OpenAI-compatible endpoint in front of every RUNNING replica.
``gateway.app.build(engine, settings)`` gives the ASGI app; ``gateway.app.serve`` runs it."""

"""The demo engine's name before issue 36 (it answered ``GET /`` and ``/health`` only, and a chat
with HTTP 501): now gpuflow/demo/standin.py, the stand-in engine that answers the OpenAI API. Kept
so that a spec written with this name still starts."""

from gpuflow.demo.standin import main

if __name__ == "__main__":
    main()

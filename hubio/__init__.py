"""Hub I/O shared by the control plane (``activities/``) and the host agent (``worker_agent/``),
which may not import each other: listing a Hugging Face repository at a commit, and mapping
huggingface_hub's errors to ours. Imports only ``scheduler``."""

"""The host agent (GPU discovery, process launch and supervision). Built by the agent issues."""

"""The project's own errors. Every message names what was wrong and where."""


class GpuflowError(Exception):
    """Base class for errors gpuflow reports to people (CLI exit code 2)."""


class InvalidInput(GpuflowError):
    """A file, spec or argument is not acceptable; the message names the field and the problem."""


class ModelFileError(InvalidInput):
    """A model file (GGUF, config.json, safetensors) is missing, truncated or corrupt."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

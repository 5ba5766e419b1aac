"""What the estimate reads from a local model path, as it crosses Temporal: asked of a GPU host
that has the path (the agent's ``read_model_header``: :class:`HeaderRequest`), answered with
:class:`EstimateInputs`, costed on the control plane (scheduler/estimate.py ``request_from_inputs``).

- GGUF: the parsed header (:class:`GGUFData`: metadata with arrays as element type and length,
  tensor infos, sizes), a few hundred KB at most, never tensor data;
- a Hugging Face directory: the model parameters its ``config.json`` gives (:class:`HFParams`,
  numbers and names only: never the file itself, which a path chosen by a deployer could make any
  JSON file on the host), and the weight bytes its safetensors headers add up to.

The encoding is the scheduler's (scheduler/model_codec.py). Every field is bounded: the agent
validates its answer as it makes it (a model file past these is the file's fault, ModelError)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scheduler.bounds import MAX_TEXT, Lines, Path, ShortText
from scheduler.naming import NAME_MAX

MAX_FIGURE = 2**64 - 1  # a file size, an offset, a dimension: what a uint64 header field may say
MAX_TENSOR_BYTES = 2**264  # a tensor's bytes: four uint64 dimensions times a block's size (the reader's product)
MAX_TENSORS = 2**20  # a GGUF model's tensors (large MoE models have a few thousand)
MAX_KEYS = 2**16  # a GGUF header's metadata keys
MAX_FILES = 100_000  # weight files of a directory

Figure = Annotated[int, Field(ge=0, le=MAX_FIGURE)]
Key = Annotated[str, Field(max_length=MAX_TEXT)]
Tensor = Annotated[tuple[Key, Annotated[list[Figure], Field(max_length=8)], Annotated[int, Field(ge=0, le=2**32)], Figure,
                         Annotated[int, Field(ge=0, le=MAX_TENSOR_BYTES)]], Field(max_length=5)]  # [name, dims, type id, offset, bytes]


class HeaderRequest(BaseModel):
    """Read ``path`` on this host: as a GGUF file when ``gguf``, else as a model directory, as the
    estimator would."""

    path: Path
    gguf: bool


class GGUFData(BaseModel):
    """A GGUF header as plain data (scheduler/model_codec.py ``encode_header``): the same header
    the reader gives locally, decoded by ``decode_header``."""

    path: Path
    version: Annotated[int, Field(ge=0, le=2**32)]
    size: Figure  # the files' sizes together
    model_size: Figure  # their headers' sizes together
    metadata: Annotated[dict[Key, Any], Field(max_length=MAX_KEYS)]
    tensors: Annotated[list[Tensor], Field(max_length=MAX_TENSORS)]


class HFParams(BaseModel):
    """A Hugging Face directory's model parameters (scheduler/hf/config.py ``ModelParameters``,
    without the file itself). Fields a newer agent adds are dropped, as ``decode_params`` drops them."""

    model_config = ConfigDict(extra="ignore")

    architectures: Annotated[list[Annotated[str, Field(max_length=NAME_MAX)]], Field(max_length=64)] = []
    model_type: ShortText = ""
    num_layers: Figure = 0
    num_attention_heads: Figure = 0
    num_kv_heads: Figure = 0
    hidden_size: Figure = 0
    head_dim: Figure = 0
    vocab_size: Figure = 0
    max_model_len: Figure = 0
    dtype_bytes: Figure = 2
    vision_num_attention_heads: Figure | None = None
    kv_lora_rank: Figure | None = None  # MLA
    qk_rope_head_dim: Figure | None = None
    num_experts: Figure = 0
    source: ShortText = "autoconfig"  # or "config.json": read from the file alone


class EstimateInputs(BaseModel):
    """A host's read of a local model path: what scheduler/estimate.py ``request_from_inputs`` costs."""

    path: Path
    kind: Literal["gguf", "hf"]
    worker: Annotated[str, Field(max_length=NAME_MAX)] = ""  # the host that read it
    mtime_ns: Figure = 0
    size: Figure = 0
    gguf: GGUFData | None = None  # kind gguf
    params: HFParams | None = None  # kind hf, with a config.json
    weight_bytes: Figure = 0
    weight_files: Annotated[list[Path], Field(max_length=MAX_FILES)] = []

    def stamp(self) -> tuple:
        """What makes two reads the same: the file's path, mtime and size (not the host)."""
        return (self.path, self.kind, self.mtime_ns, self.size)


class ReaderHosts(BaseModel):
    """The hosts to read a local path on (scheduler/model_readers.py), and why the others are left out."""

    hosts: Annotated[list[Annotated[str, Field(max_length=NAME_MAX)]], Field(max_length=100_000)] = []
    reasons: Lines = []  # past 20,000, cut, saying how many more

"""A fingerprint: what a replica's memory use depends on, so that replicas with the same one can
learn one claim. The model's source (and its digest, where known), the engine and its version, the
engine parameters that change memory (below, per engine), and the GPU model. Parameters that do
not change memory (ports, logging, tool parsers, chat templates...) leave it unchanged, and so do
a parameter's spellings (``-tp 2``, ``--tensor-parallel-size=2``, ``--tensor_parallel_size 2``)
and the defaults written out (a parallel size of 1).

The key is the same hash the usage profiles use (store/usage.py's profile_key: ``text_key``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# engine -> flag spelling -> (the parameter's name, takes a value). vLLM's and SGLang's context,
# parallelism, quantization, KV dtype, batch and memory fractions; llama.cpp's context, parallel
# slots, offloaded layers, KV types, batches, flash attention, split.
_VLLM = {
    "--max-model-len": ("context", True), "--tensor-parallel-size": ("tp", True), "-tp": ("tp", True),
    "--tp": ("tp", True), "--pipeline-parallel-size": ("pp", True), "-pp": ("pp", True), "--pp": ("pp", True),
    "--data-parallel-size": ("dp", True), "-dp": ("dp", True), "--dp": ("dp", True),
    "--quantization": ("quantization", True), "-q": ("quantization", True), "--kv-cache-dtype": ("kv_dtype", True),
    "--max-num-seqs": ("max_seqs", True), "--dtype": ("dtype", True), "--max-num-batched-tokens": ("batch", True),
    "--gpu-memory-utilization": ("memory_fraction", True), "--cpu-offload-gb": ("cpu_offload_gb", True),
    "--enforce-eager": ("eager", False), "--speculative-config": ("speculative", True),
    "--enable-expert-parallel": ("expert_parallel", False), "--max-lora-rank": ("lora_rank", True),
    "--enable-lora": ("lora", False),
}
_SGLANG = {
    "--context-length": ("context", True), "--tp-size": ("tp", True), "--tp": ("tp", True),
    "--pp-size": ("pp", True), "--dp-size": ("dp", True), "--dp": ("dp", True),
    "--quantization": ("quantization", True), "--kv-cache-dtype": ("kv_dtype", True),
    "--max-running-requests": ("max_seqs", True), "--dtype": ("dtype", True),
    "--mem-fraction-static": ("memory_fraction", True), "--max-total-tokens": ("kv_tokens", True),
    "--chunked-prefill-size": ("batch", True), "--cuda-graph-max-bs": ("graph_batch", True),
    "--disable-cuda-graph": ("eager", False), "--speculative-algorithm": ("speculative", True),
}
_LLAMA_CPP = {
    "--ctx-size": ("context", True), "-c": ("context", True), "--parallel": ("max_seqs", True),
    "-np": ("max_seqs", True), "--n-gpu-layers": ("gpu_layers", True), "-ngl": ("gpu_layers", True),
    "--gpu-layers": ("gpu_layers", True), "--cache-type-k": ("kv_dtype_k", True), "-ctk": ("kv_dtype_k", True),
    "--cache-type-v": ("kv_dtype_v", True), "-ctv": ("kv_dtype_v", True), "--batch-size": ("batch", True),
    "-b": ("batch", True), "--ubatch-size": ("ubatch", True), "-ub": ("ubatch", True),
    "--flash-attn": ("flash_attn", True), "-fa": ("flash_attn", True), "--tensor-split": ("tensor_split", True),
    "-ts": ("tensor_split", True), "--split-mode": ("split_mode", True), "-sm": ("split_mode", True),
    "--no-kv-offload": ("no_kv_offload", False), "-nkvo": ("no_kv_offload", False),
    "--mmproj": ("mmproj", True), "--swa-full": ("swa_full", False), "--kv-unified": ("kv_unified", False),
}
MEMORY_FLAGS: dict[str, dict[str, tuple[str, bool]]] = {"vllm": _VLLM, "sglang": _SGLANG, "llama.cpp": _LLAMA_CPP}
UNDERSCORES = {"vllm", "sglang"}  # argparse engines: --max_model_len reads as --max-model-len
DEFAULTS = {"tp": "1", "pp": "1", "dp": "1"}  # written out or not, the same memory


def text_key(*parts: str) -> str:
    """The hash both the usage profiles and the fingerprints are keyed by (32 hex digits)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def memory_params(backend: str, parameters: list[str] | str) -> tuple[tuple[str, str], ...]:
    """The parameters that change memory, by name, sorted: the first occurrence of each wins (as
    the engines' and GPUStack's find_parameter). An engine without a list here (custom, voxbox):
    every word counts, in order, since nothing says which do not."""
    words = parameters.split() if isinstance(parameters, str) else list(parameters)
    flags = MEMORY_FLAGS.get(backend)
    if flags is None:
        return tuple((str(i), w) for i, w in enumerate(words))
    toks: list[str] = []
    for w in words:
        toks.extend(w.split("=", 1) if w.startswith("-") and "=" in w else [w])
    out: dict[str, str] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("--") and backend in UNDERSCORES:
            t = t.replace("_", "-")
        spec = flags.get(t)
        i += 1
        if spec is None:
            continue
        name, takes_value = spec
        value = "on"
        if takes_value and i < len(toks) and not _is_flag(toks[i], flags):
            value = toks[i]  # a value, even '-1' (--n-gpu-layers -1); a flag next: a switch's old form
            i += 1
        out.setdefault(name, value.lower() if name not in ("mmproj", "speculative") else value)
    return tuple(sorted((k, v) for k, v in out.items() if DEFAULTS.get(k) != v))


def _is_flag(tok: str, flags: dict) -> bool:
    return tok.startswith("--") or tok in flags


@dataclass(frozen=True)
class Fingerprint:
    source: str  # the spec's source key (scheduler/spec.py Source.key)
    backend: str
    params: tuple[tuple[str, str], ...]  # memory_params()
    gpu_model: str
    backend_version: str = ""
    digest: str = ""  # the model's digest or revision, where known

    @property
    def key(self) -> str:
        return text_key("claims/1", self.source, self.digest, self.backend, self.backend_version,
                        self.params_text, self.gpu_model)

    @property
    def params_text(self) -> str:
        """'context=8192 tp=2' (sorted by name)."""
        return " ".join(f"{k}={v}" if v != "on" else k for k, v in self.params)

    def label(self) -> str:
        """One line for people: 'hf:org/name vllm 0.11.0 [context=8192 tp=2] on H100 80GB'."""
        engine = f"{self.backend} {self.backend_version}".strip()
        src = self.source + (f"@{self.digest[:12]}" if self.digest else "")
        return f"{src} {engine} [{self.params_text}] on {self.gpu_model or 'unknown GPU'}"


def fingerprint(source: str, backend: str, parameters: list[str] | str, gpu_model: str, *,
                backend_version: str | None = None, digest: str | None = None) -> Fingerprint:
    """The fingerprint of a replica: what its spec (or its usage report) says it ran."""
    return Fingerprint(source=source, backend=backend, params=memory_params(backend, parameters),
                       gpu_model=gpu_model.strip(), backend_version=(backend_version or "").strip(),
                       digest=(digest or "").strip())


def of_spec(spec, gpu_model: str, digest: str | None = None) -> Fingerprint:
    """The fingerprint of a ModelSpec's replica (scheduler/spec.py) on a GPU of ``gpu_model``."""
    return fingerprint(spec.source.key, spec.backend.value, list(spec.backend_parameters), gpu_model,
                       backend_version=spec.backend_version, digest=digest)

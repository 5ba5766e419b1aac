"""Which engine flags a model spec's ``backend_parameters`` may carry.

gpuflow builds each engine's command line from the placement (worker_agent/engines.py). Three
kinds of flags are checked, at spec validation and again by the agent before a launch:

- **owned**: what gpuflow sets and a spec may never override: where the server listens (host,
  port, socket), which model it serves and under which name, how the nodes of a placement across
  workers find each other (llama.cpp's --rpc, SGLang's --dist-init-addr/--nnodes/--node-rank),
  KV-cache sizes in bytes that bypass the memory share the ledger booked, and flags that read
  further flags, models or files from elsewhere (vLLM --config, --download-dir,
  --allowed-local-media-path (lets clients read the host's files), llama-server --model-url,
  --hf-repo, --path, --log-file, --slot-save-path, llama-cpp-python --config_file).
- **placement inputs**: parallel sizes, the GPU memory share, llama.cpp's --gpu-layers and
  --tensor-split. The scheduler reads these (scheduler/params.py, as GPUStack does) and books the
  placement from them, so the engine runs with what was booked. They must be spelled as the
  scheduler reads them: an abbreviation (Python engines' argparse accepts any unambiguous prefix,
  ``--gpu-memory-util 0.99``) would reach the engine unread, and is refused.
- **remote code**: flags that make the engine run code that came with the model's files or with
  requests (``--trust-remote-code``, vLLM's parser plugins, SGLang's custom logit processors).
  They pass only on agents started with ``--allow-remote-code``.

Both ``--flag value`` and ``--flag=value`` are read; Python engines also accept ``_`` for ``-``
and any unambiguous prefix of a long flag, so those forms count too.
"""

from __future__ import annotations

OWNED = {
    "vllm": ("--host", "--port", "--uds", "--model", "--served-model-name", "--config", "--headless",
             "--distributed-executor-backend", "--data-parallel-address", "--data-parallel-rpc-port",
             "--kv-cache-memory-bytes", "--kv-cache-memory", "--allowed-local-media-path", "--download-dir"),
    "sglang": ("--host", "--port", "--model-path", "--model", "--served-model-name", "--config", "--dist-init-addr",
               "--nccl-init-addr", "--nnodes", "--node-rank", "--base-gpu-id", "--gpu-id-step"),
    "llama.cpp": ("-m", "--model", "--host", "--port", "-a", "--alias", "--rpc", "-mu", "--model-url", "-hf", "-hfr",
                  "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo", "--path", "--log-file", "--slot-save-path",
                  # llama-cpp-python's spellings (an agent may serve llama.cpp models with it)
                  "--model_alias", "--n_gpu_layers", "--tensor_split", "--rpc_servers", "--config_file"),
}
PLACEMENT_INPUTS = {
    "vllm": ("--tensor-parallel-size", "-tp", "--tp", "--pipeline-parallel-size", "-pp", "--pp",
             "--data-parallel-size", "-dp", "--dp", "--gpu-memory-utilization"),
    "sglang": ("--tp-size", "--tensor-parallel-size", "--tp", "--pp-size", "--pipeline-parallel-size", "--dp-size",
               "--data-parallel-size", "--dp", "--mem-fraction-static"),
    "llama.cpp": ("-ngl", "--gpu-layers", "--n-gpu-layers", "--tensor-split", "-ts"),
}
REMOTE_CODE = {
    "vllm": ("--trust-remote-code", "--tool-parser-plugin", "--reasoning-parser-plugin"),
    "sglang": ("--trust-remote-code", "--enable-custom-logit-processor"),
}
ARGPARSE = ("vllm", "sglang")  # Python engines: '_' reads as '-', and unambiguous prefixes are accepted


def _flags(backend: str, params: list[str]) -> list[tuple[str, str]]:
    """(as written, as the engine reads it) for each word that is a flag."""
    out = []
    for word in params:
        if not isinstance(word, str) or not word.startswith("-") or word == "-" or word[1:2].isdigit():
            continue  # a value (negative numbers included)
        name = word.split("=", 1)[0].split()[0] if word.strip() else word
        if backend in ARGPARSE and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        out.append((word, name))
    return out


def _hits(backend: str, name: str, flags: tuple[str, ...]) -> str | None:
    """The flag of ``flags`` that ``name`` is, or abbreviates (Python engines, long flags)."""
    if name in flags:
        return name
    if backend in ARGPARSE and name.startswith("--") and len(name) > 3:
        return next((f for f in flags if f.startswith("--") and f.startswith(name)), None)
    return None


def flag_problems(backend: str, params: list[str]) -> list[str]:
    """Why these backend_parameters are refused for ``backend`` whatever the host: owned flags,
    and placement inputs spelled in a way the scheduler does not read."""
    owned, inputs = OWNED.get(backend, ()), PLACEMENT_INPUTS.get(backend, ())
    out = []
    for word, name in _flags(backend, params):
        if (f := _hits(backend, name, owned)) is not None:
            out.append(f"backend_parameters: {word!r} sets {f}, which a spec may not set (gpuflow sets it from the "
                       "placement, or it reaches files outside the instance); remove it")
        elif name not in inputs and (f := _hits(backend, name, inputs)) is not None:
            out.append(f"backend_parameters: {word!r} abbreviates {f}; write {f} in full (gpuflow reads it to book "
                       "the placement)")
    return out


def remote_code_flags(backend: str, params: list[str]) -> list[str]:
    """The flags (as written) that make the engine run code from the model's files or requests."""
    flags = REMOTE_CODE.get(backend, ())
    return [word for word, name in _flags(backend, params) if _hits(backend, name, flags)]

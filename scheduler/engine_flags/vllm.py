"""`vllm serve` (vLLM 0.11.0): the flags a spec may pass, and those it never may.

Left off the list on purpose (an operator may add one with ``gpuflow agent --allow-engine-flag``
and GPUFLOW_ALLOW_ENGINE_FLAGS; owned ones never): --kv-transfer-config and --kv-events-config
(connectors imported by module path, peers on the network), --default-mm-loras (files by
modality), --enable-prompt-embeds (tensors from clients), --trust-request-chat-template
(templates from clients), --num-gpu-blocks-override (a KV cache beyond the booked share),
--ssl-* (the gateway talks plain HTTP to the engine), --tool-server,
--otlp-traces-endpoint and the hub revisions (network), --structured-outputs-config,
--additional-config, --model-loader-extra-config, --log-config-file, --root-path, and the
dotted JSON forms (--speculative-config.model X): write the JSON whole.
"""

from __future__ import annotations

from scheduler.engine_flags.kinds import (CODE_SWITCH, HUB_PATH, INT_, NAME_, NUMBER_, SIZE_, SWITCH, TEMPLATE, TEXT,
                                          Flag, choice, json_object)

ARGPARSE = True  # '_' reads as '-', and argparse takes any unambiguous prefix of a long flag

UNDERSCORE = True  # reads --a_b as --a-b
ESTIMATE_INPUTS: tuple[str, ...] = ()  # beyond PLACEMENT_INPUTS, none is read by gpuflow

OWNED = ("--host", "--port", "--uds", "--model", "--served-model-name", "--config", "--headless",
         "--distributed-executor-backend", "--data-parallel-address", "--data-parallel-rpc-port",
         "--kv-cache-memory-bytes", "--kv-cache-memory", "--allowed-local-media-path", "--download-dir",
         "--api-key")  # the replica's engine key, which gpuflow sets (worker_agent/engine_key.py)
PLACEMENT_INPUTS = ("--tensor-parallel-size", "-tp", "--tp", "--pipeline-parallel-size", "-pp", "--pp",
                    "--data-parallel-size", "-dp", "--dp", "--gpu-memory-utilization")
NETWORK = ("--tool-server", "--hf-token", "--revision", "--code-revision", "--tokenizer-revision",
           "--otlp-traces-endpoint", "--allowed-media-domains")

_BOOLS = ("--enforce-eager", "--enable-prefix-caching", "--enable-chunked-prefill", "--disable-custom-all-reduce",
          "--disable-sliding-window", "--disable-cascade-attn", "--enable-auto-tool-choice", "--enable-lora",
          "--fully-sharded-loras", "--enable-expert-parallel", "--enable-eplb",
          "--async-scheduling", "--skip-tokenizer-init", "--enable-prompt-tokens-details",
          "--enable-force-include-usage", "--enable-server-load-tracking", "--disable-uvicorn-access-log",
          "--disable-fastapi-docs", "--enable-request-id-headers", "--return-tokens-as-token-ids",
          "--exclude-tools-when-tool-choice-none", "--disable-hybrid-kv-cache-manager", "--disable-chunked-mm-input",
          "--enable-log-outputs", "--enable-log-requests", "--use-tqdm-on-load", "--calculate-kv-scales",
          "--enable-dbo", "--interleave-mm-strings", "--skip-mm-profiling", "--kv-sharing-fast-prefill",
          "--log-error-stack", "--enable-sleep-mode")
_SPECULATIVE = json_object(
    keys=("method", "num_speculative_tokens", "draft_tensor_parallel_size", "disable_logprobs", "quantization",
          "max_model_len", "disable_by_batch_size", "disable_padded_drafter_batch", "prompt_lookup_max",
          "prompt_lookup_min", "speculative_token_tree", "enforce_eager"),
    paths=("model",), hub=True)
_COMPILATION = json_object(keys=("level", "mode", "cudagraph_mode", "cudagraph_capture_sizes", "max_capture_size",
                                 "full_cuda_graph", "use_cudagraph", "use_inductor", "compile_sizes", "custom_ops",
                                 "splitting_ops", "cudagraph_num_of_warmups", "cudagraph_copy_inputs",
                                 "use_inductor_graph_partition", "pass_config"))
_FREE_JSON = json_object()  # any key; no value may name a file or URL

ALLOW: dict[str, Flag] = {
    **{f: SWITCH for f in _BOOLS}, **{"--no-" + f[2:]: SWITCH for f in _BOOLS},
    "--disable-log-stats": SWITCH, "--disable-log-requests": SWITCH, "--disable-mm-preprocessor-cache": SWITCH,
    "--no-trust-remote-code": SWITCH,
    # placement inputs: the scheduler reads them (scheduler/params.py)
    "--tensor-parallel-size": INT_, "-tp": INT_, "--pipeline-parallel-size": INT_, "-pp": INT_,
    "--data-parallel-size": INT_, "-dp": INT_, "--gpu-memory-utilization": NUMBER_,
    # sizes and counts
    "--max-model-len": SIZE_, "--max-num-batched-tokens": SIZE_, "--max-num-seqs": INT_, "--block-size": INT_,
    "--seed": INT_, "--max-logprobs": INT_, "--max-loras": INT_, "--max-lora-rank": INT_, "--max-cpu-loras": INT_,
    "--lora-extra-vocab-size": INT_, "--max-parallel-loading-workers": INT_, "--num-lookahead-slots": INT_,
    "--max-num-partial-prefills": INT_, "--max-long-partial-prefills": INT_, "--long-prefill-token-threshold": INT_,
    "--max-log-len": INT_, "--num-redundant-experts": INT_, "--cuda-graph-sizes": Flag("int", many=True),
    "--swap-space": NUMBER_, "--cpu-offload-gb": NUMBER_, "--rope-theta": NUMBER_, "--mm-processor-cache-gb": NUMBER_,
    "--video-pruning-rate": NUMBER_, "-O": choice("0", "1", "2", "3"),
    # choices and names (no path meaning)
    "--dtype": choice("auto", "half", "float16", "bfloat16", "float", "float32"),
    "--kv-cache-dtype": choice("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"),
    "--mamba-ssm-cache-dtype": choice("auto", "float32"), "--mamba-cache-dtype": choice("auto", "float32"),
    "--load-format": choice("auto", "pt", "safetensors", "npcache", "dummy", "bitsandbytes", "gguf", "mistral",
                            "fastsafetensors", "sharded_state"),
    "--tokenizer-mode": choice("auto", "slow", "mistral"),  # 'custom' is a registered class
    "--runner": choice("auto", "generate", "pooling", "draft"),
    "--convert": choice("auto", "none", "embed", "classify", "reward"),
    "--model-impl": choice("auto", "vllm", "transformers"),
    "--scheduling-policy": choice("fcfs", "priority"),
    "--prefix-caching-hash-algo": choice("sha256", "sha256_cbor"),
    "--chat-template-content-format": choice("auto", "string", "openai"),
    "--uvicorn-log-level": choice("debug", "info", "warning", "error", "critical", "trace"),
    "--mm-encoder-tp-mode": choice("weights", "data"), "--mm-processor-cache-type": choice("shm", "lru"),
    "--quantization": NAME_, "-q": NAME_, "--reasoning-parser": NAME_, "--tool-call-parser": NAME_,
    "--logprobs-mode": NAME_, "--lora-dtype": NAME_, "--response-role": TEXT,
    # files: inside the model's folder (relative paths resolve against it). Hub flags (kinds.py):
    # vLLM downloads a value naming no local folder, so it must be written as a path
    "--tokenizer": HUB_PATH, "--hf-config-path": HUB_PATH, "--chat-template": TEMPLATE,
    "--lora-modules": Flag("lora", many=True, hub=True),  # lora/utils.py get_adapter_absolute_path
    "--generation-config": Flag("path", choices=("auto", "vllm"), hub=True),  # or a folder (config/model.py)
    # JSON: only the keys listed, paths checked as files
    "--speculative-config": _SPECULATIVE, "--compilation-config": _COMPILATION,
    "--hf-overrides": json_object(code_keys=("auto_map",)), "--override-generation-config": _FREE_JSON,
    "--limit-mm-per-prompt": _FREE_JSON, "--mm-processor-kwargs": _FREE_JSON, "--rope-scaling": _FREE_JSON,
    "--override-pooler-config": _FREE_JSON, "--pooler-config": _FREE_JSON, "--media-io-kwargs": _FREE_JSON,
    # code: imported by name or from a file, so only with --allow-remote-code
    "--trust-remote-code": CODE_SWITCH,
    "--tool-parser-plugin": Flag("path", code=True),
    "--worker-extension-cls": Flag("qualname", code=True), "--worker-cls": Flag("qualname", code=True),
    "--scheduler-cls": Flag("qualname", code=True), "--io-processor-plugin": Flag("name", code=True),
    "--middleware": Flag("qualname", code=True),
    "--logits-processors": Flag("qualname", many=True, code=True),
    "--logits-processor-pattern": Flag("text", code=True),
}

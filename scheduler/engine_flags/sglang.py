"""`python -m sglang.launch_server` (SGLang 0.5.3): the flags a spec may pass, and those it never may.

Left off the list on purpose (an operator may add one; owned ones never): --custom-weight-loader
(imports a function by name: code, and no spec needs it), --load-format remote/remote_instance and
--remote-instance-* (weights from the network), --kv-events-config, --disaggregation-* (peers),
--hicache-storage-backend* and --file-storage-path (writes elsewhere), --debug-tensor-dump-*,
--crash-dump-folder, --enable-lora with adapters from requests aside, --tool-server
(network), and every distributed flag gpuflow sets from the placement.
"""

from __future__ import annotations

from scheduler.engine_flags.kinds import (CODE_SWITCH, HUB_PATH, INT_, NAME_, NUMBER_, SIZE_, SWITCH, TEMPLATE, Flag,
                                          choice, json_object)

ARGPARSE = True  # plain argparse: any unambiguous prefix of a long flag is taken

UNDERSCORE = False  # argparse as is: --a_b is not --a-b
ESTIMATE_INPUTS: tuple[str, ...] = ()  # beyond PLACEMENT_INPUTS, none is read by gpuflow

OWNED = ("--host", "--port", "--model-path", "--model", "--served-model-name", "--config", "--dist-init-addr",
         "--nccl-init-addr", "--nnodes", "--node-rank", "--base-gpu-id", "--gpu-id-step", "--download-dir",
         "--api-key")  # the replica's engine key, which gpuflow sets (worker_agent/engine_key.py)
PLACEMENT_INPUTS = ("--tp-size", "--tensor-parallel-size", "--tp", "--pp-size", "--pipeline-parallel-size", "--dp-size",
                    "--data-parallel-size", "--dp", "--mem-fraction-static")
NETWORK = ("--tool-server", "--revision", "--speculative-draft-model-revision",
           "--remote-instance-weight-loader-seed-instance-ip",
           "--remote-instance-weight-loader-seed-instance-service-port",
           "--remote-instance-weight-loader-send-weights-group-ports", "--oltp-traces-endpoint")

_SWITCHES = ("--disable-radix-cache", "--disable-cuda-graph", "--disable-cuda-graph-padding", "--enable-torch-compile",
             "--enable-mixed-chunk", "--enable-dp-attention", "--enable-dp-lm-head", "--enable-metrics",
             "--enable-cache-report", "--log-requests", "--disable-overlap-schedule", "--skip-server-warmup",
             "--enable-lora", "--is-embedding", "--enable-multimodal", "--disable-custom-all-reduce",
             "--enable-p2p-check", "--enable-nan-detection", "--allow-auto-truncate",
             "--stream-output", "--enable-deterministic-inference", "--enable-priority-scheduling",
             "--enable-hierarchical-cache", "--disable-chunked-prefix-cache", "--enable-two-batch-overlap",
             "--skip-tokenizer-init", "--disable-fast-image-processor", "--show-time-cost", "--enable-memory-saver",
             "--disable-shared-experts-fusion", "--disable-outlines-disk-cache", "--sleep-on-idle",
             "--enable-request-time-stats-logging", "--enable-tokenizer-batch-encode")

ALLOW: dict[str, Flag] = {
    **{f: SWITCH for f in _SWITCHES},
    # placement inputs: the scheduler reads them (scheduler/params.py); --tp and --dp are argparse
    # prefixes of --tp-size and --dp-size (the agent writes --tp)
    "--tp-size": INT_, "--tensor-parallel-size": INT_, "--tp": INT_, "--pp-size": INT_,
    "--pipeline-parallel-size": INT_, "--dp-size": INT_, "--data-parallel-size": INT_, "--dp": INT_,
    "--mem-fraction-static": NUMBER_, "--ep-size": INT_, "--expert-parallel-size": INT_, "--ep": INT_,
    # sizes and counts
    "--context-length": SIZE_, "--max-running-requests": INT_, "--max-total-tokens": INT_,
    "--max-prefill-tokens": INT_, "--chunked-prefill-size": INT_, "--max-queued-requests": INT_, "--page-size": INT_,
    "--random-seed": INT_, "--stream-interval": INT_, "--cuda-graph-max-bs": INT_, "--cuda-graph-bs": Flag("int", many=True),
    "--torch-compile-max-bs": INT_, "--num-continuous-decode-steps": INT_, "--max-loras-per-batch": INT_,
    "--max-lora-rank": INT_, "--max-loaded-loras": INT_, "--decode-log-interval": INT_, "--cpu-offload-gb": INT_,
    "--max-mamba-cache-size": INT_, "--speculative-num-steps": INT_, "--speculative-eagle-topk": INT_,
    "--speculative-num-draft-tokens": INT_, "--watchdog-timeout": NUMBER_, "--dist-timeout": INT_,
    "--schedule-conservativeness": NUMBER_, "--swa-full-tokens-ratio": NUMBER_, "--hicache-ratio": NUMBER_,
    "--hicache-size": INT_,
    # choices and names (no path meaning)
    "--dtype": choice("auto", "half", "float16", "bfloat16", "float", "float32"),
    "--kv-cache-dtype": choice("auto", "fp8_e5m2", "fp8_e4m3"),
    "--tokenizer-mode": choice("auto", "slow"),
    "--load-format": choice("auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes",
                            "layered"),
    "--schedule-policy": choice("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
    "--quantization": NAME_, "--attention-backend": NAME_, "--prefill-attention-backend": NAME_,
    "--decode-attention-backend": NAME_, "--mm-attention-backend": NAME_, "--sampling-backend": NAME_,
    "--grammar-backend": NAME_, "--moe-runner-backend": NAME_, "--lora-backend": NAME_,
    "--lora-target-modules": Flag("name", many=True), "--speculative-algorithm": NAME_, "--tool-call-parser": NAME_,
    "--reasoning-parser": NAME_, "--log-level": NAME_, "--log-level-http": NAME_, "--device": NAME_,
    # files: inside the model's folder (relative paths resolve against it). Hub flags (kinds.py):
    # SGLang downloads a value naming no local file (the token map: its folder's repository), so
    # each must be written as a path
    "--tokenizer-path": HUB_PATH, "--chat-template": TEMPLATE, "--completion-template": TEMPLATE,
    "--lora-paths": Flag("lora", many=True, hub=True), "--speculative-draft-model-path": HUB_PATH,
    "--speculative-token-map": HUB_PATH,
    # JSON
    "--json-model-override-args": json_object(code_keys=("auto_map",)), "--preferred-sampling-params": json_object(),
    # code: only with --allow-remote-code
    "--trust-remote-code": CODE_SWITCH, "--enable-custom-logit-processor": CODE_SWITCH,
}

"""llama-server (the llama.cpp that llama-cpp-python 0.3.36 vendors, common/arg.cpp): the flags a
spec may pass, and those it never may.

llama-server takes flags exactly as listed (no prefixes), reads '_' as '-' in long flags, and
takes the word after a flag as its value whatever it looks like. ``EARLIER``: spellings that
llama-server builds before --load-mode took, which gpuflow's estimator still reads.

Left off the list on purpose (an operator may add one; owned and network ones never):
--media-path (clients read the host's files), --log-prompts-dir, --lookup-cache-dynamic and
--slot-save-path (writes), --ssl-* and --api-prefix (the gateway talks plain
HTTP at /v1), --props (clients change server settings), -dev/--device (RPC devices are network
peers), --models-dir/--models-preset (router mode: other models), --tools, --mcp-servers-*
(run tools), and every draft-model flag but -md/--model-draft and --spec-draft-model.
"""

from __future__ import annotations

from scheduler.engine_flags.kinds import (INT_, NAME_, NUMBER_, NUMBERS_, PATH, PATHS, SWITCH, TEXT, Flag, choice,
                                          json_object)

ARGPARSE = False

UNDERSCORE = True  # reads --a_b as --a-b

OWNED = ("-m", "--model", "--host", "--port", "-a", "--alias", "--rpc", "--path", "--log-file", "--slot-save-path",
         "--models-dir", "--models-preset", "--reuse-port", "--no-host",
         "--api-key", "--api-key-file",  # the replica's engine key, which gpuflow sets (worker_agent/engine_key.py)
         # llama-cpp-python's spellings (an agent may serve llama.cpp models with it); its hub forms
         # of the model and of its tokenizer (llama_cpp/server/settings.py) are the model's too
         "--model_alias", "--n_gpu_layers", "--tensor_split", "--rpc_servers", "--config_file", "--hf_model_repo_id",
         "--hf_pretrained_model_name_or_path")
PLACEMENT_INPUTS = ("-ngl", "--gpu-layers", "--n-gpu-layers", "--tensor-split", "-ts")
# what the estimator reads (scheduler/params.py llama_cpp_options), in every spelling llama-server documents
ESTIMATE_INPUTS = ("-c", "--ctx-size", "-np", "--parallel", "-b", "--batch-size", "-ub", "--ubatch-size", "-ctk",
                   "--cache-type-k", "-ctv", "--cache-type-v", "-fa", "--flash-attn", "--no-mmap", "-nkvo",
                   "--no-kv-offload", "--swa-full")
NETWORK = ("-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hfd", "-hfrd", "--hf-repo-draft",
           "-hft", "--hf-token", "-dr", "--docker-repo",
           "-mmu", "--mmproj-url", "--spec-draft-hf", "--mcp-servers-config", "--mcp-servers-json")

_ON_OFF = choice("on", "off", "auto", "enabled", "disabled", "true", "false", "1", "0")
_KV_TYPES = choice("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_SWITCHES = ("--jinja", "--no-jinja", "-cb", "--cont-batching", "-nocb", "--no-cont-batching", "--metrics", "--slots",
             "--no-slots", "--embedding", "--embeddings", "--reranking", "--rerank", "-kvu", "--kv-unified",
             "-no-kvu", "--no-kv-unified", "-nkvo", "--no-kv-offload", "-kvo", "--kv-offload", "--swa-full",
             "--warmup", "--no-warmup", "--context-shift", "--no-context-shift", "--cache-prompt", "--no-cache-prompt",
             "--no-webui", "--no-ui", "--log-disable", "--log-timestamps", "--log-prefix", "--no-perf", "-cmoe",
             "--cpu-moe", "--check-tensors", "-sp", "--special", "--no-op-offload", "--no-repack", "--no-mmproj",
             "--mmproj-offload", "--no-mmproj-offload", "-e", "--escape", "--no-escape", "--offline", "-v", "--verbose",
             "--log-verbose", "--ignore-eos", "--cache-idle-slots", "--no-cache-idle-slots")
EARLIER = ("--no-mmap", "--mmap", "--mlock")

ALLOW: dict[str, Flag] = {
    **{f: SWITCH for f in _SWITCHES + EARLIER},
    # placement inputs: the scheduler reads them (scheduler/params.py)
    "-ngl": INT_, "--gpu-layers": INT_, "--n-gpu-layers": INT_, "-ts": NUMBERS_, "--tensor-split": NUMBERS_,
    # what the estimator reads, and other sizes and counts
    "-c": INT_, "--ctx-size": INT_, "-np": INT_, "--parallel": INT_, "-b": INT_, "--batch-size": INT_,
    "-ub": INT_, "--ubatch-size": INT_, "-ctk": _KV_TYPES, "--cache-type-k": _KV_TYPES, "-ctv": _KV_TYPES,
    "--cache-type-v": _KV_TYPES, "-fa": _ON_OFF, "--flash-attn": _ON_OFF,
    "-lm": choice("auto", "none", "mmap", "mlock", "mmap+mlock"), "--load-mode": choice("auto", "none", "mmap", "mlock",
                                                                                          "mmap+mlock"),
    "-t": INT_, "--threads": INT_, "-tb": INT_, "--threads-batch": INT_, "--threads-http": INT_, "-n": INT_,
    "--predict": INT_, "--n-predict": INT_, "--keep": INT_, "-s": INT_, "--seed": INT_, "--cache-reuse": INT_,
    "-ctxcp": INT_, "--ctx-checkpoints": INT_, "--swa-checkpoints": INT_, "-ncmoe": INT_, "--n-cpu-moe": INT_,
    "-mg": INT_, "--main-gpu": INT_, "-to": INT_, "--timeout": INT_, "--reasoning-budget": INT_, "-cram": INT_,
    "--cache-ram": INT_, "--image-min-tokens": INT_, "--image-max-tokens": INT_, "--top-k": INT_,
    "--mirostat": INT_, "--repeat-last-n": INT_, "-lv": INT_, "--verbosity": INT_, "--log-verbosity": INT_,
    "--sleep-idle-seconds": INT_, "--defrag-thold": NUMBER_, "-dt": NUMBER_, "--slot-prompt-similarity": NUMBER_,
    "-sps": NUMBER_, "--temp": NUMBER_, "--top-p": NUMBER_, "--min-p": NUMBER_, "--repeat-penalty": NUMBER_,
    "--presence-penalty": NUMBER_, "--frequency-penalty": NUMBER_, "--rope-freq-base": NUMBER_,
    "--rope-freq-scale": NUMBER_, "--rope-scale": NUMBER_, "--yarn-orig-ctx": INT_, "--yarn-ext-factor": NUMBER_,
    "--yarn-attn-factor": NUMBER_, "--yarn-beta-slow": NUMBER_, "--yarn-beta-fast": NUMBER_,
    # choices and names
    "--rope-scaling": choice("none", "linear", "yarn"), "--pooling": choice("none", "mean", "cls", "last", "rank"),
    "-sm": choice("none", "layer", "row", "tensor"), "--split-mode": choice("none", "layer", "row", "tensor"),
    "--numa": choice("distribute", "isolate", "numactl"), "--log-colors": _ON_OFF,
    "--reasoning-format": choice("none", "deepseek", "deepseek-legacy", "auto"), "--spec-type": NAME_,
    "--override-kv": NAME_, "-ot": TEXT, "--override-tensor": TEXT,
    # text with no path meaning (llama-server's --chat-template is the template itself, or a built-in's name)
    "--chat-template": TEXT, "-r": TEXT, "--reverse-prompt": TEXT, "--grammar": TEXT, "-j": TEXT,
    "--json-schema": TEXT, "--chat-template-kwargs": json_object(),
    # files: inside the model's folder (relative paths resolve against it)
    "--chat-template-file": PATH, "-mm": PATH, "--mmproj": PATH, "-md": PATH, "--model-draft": PATH,
    "--spec-draft-model": PATH, "--lora": PATHS, "--grammar-file": PATH, "-jf": PATH, "--json-schema-file": PATH,
    "--control-vector": PATHS, "-lcs": PATH, "--lookup-cache-static": PATH,
}

"""Tables for what a spec may ask of a host: env names (scheduler/spec_env.py), engine flags
(scheduler/engine_flags.py) and names (scheduler/naming.py). Each row is one case and the rule
that decides it."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from scheduler.engine_flags import flag_problems, remote_code_flags
from scheduler.errors import InvalidInput
from scheduler.naming import check_key, name_problem, path_in
from scheduler.spec import ModelSpec
from scheduler.spec_env import allow_pattern_problem, env_problem
from worker_agent.processes import launch_env


@pytest.mark.parametrize("name,value,extra,problem", [
    ("OMP_NUM_THREADS", "4", (), None),                              # a known knob
    ("VLLM_ATTENTION_BACKEND", "FLASHINFER", (), None),
    ("NCCL_SOCKET_IFNAME", "eth0", (), None),
    ("HF_TOKEN", "hf_x", (), None),                                  # the deployer's own token
    ("LD_PRELOAD", "/tmp/x.so", (), "not allowed"),                  # the dynamic loader
    ("LD_LIBRARY_PATH", "/tmp", (), "set by gpuflow"),               # part of the base environment
    ("BASH_ENV", "$(touch /tmp/m)", (), "not allowed"),              # bash expands it: code, no file needed
    ("PYTHONPATH", "/tmp", (), "not allowed"),                       # sitecustomize.py from anywhere
    ("PYTHONSTARTUP", "/tmp/x.py", (), "not allowed"),
    ("PYTHONWARNINGS", "ignore::evil.Cat", (), "not allowed"),       # imports the module it names
    ("PATH", "/tmp/bin", (), "set by gpuflow"),                      # which program 'python3' is
    ("HOME", "/tmp", (), "set by gpuflow"),
    ("LC_ALL", "C", (), "set by gpuflow"),                           # LC_* is the base's
    ("VLLM_PLUGINS", "x", (), "not allowed"),                        # loads plugins: left out of VLLM_*
    ("VLLM_NCCL_SO_PATH", "/tmp/x.so", (), "not allowed"),           # loads a library
    ("VLLM_LOGGING_CONFIG_PATH", "/tmp/c.json", (), "not allowed"),  # dictConfig instantiates classes
    ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1", (), "not allowed"),   # pickle
    ("NCCL_NET_PLUGIN", "x", (), "not allowed"),                     # loads libnccl-net-x.so
    ("NCCL_DEBUG_FILE", "/etc/x", (), "not allowed"),                # writes a file anywhere
    ("HF_ENDPOINT", "http://evil", (), "not allowed"),               # where the engine downloads from
    ("LLAMA_ARG_PORT", "1", (), "not allowed"),                      # llama-server's flags by env
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3", (), "set by gpuflow"),       # the placement's GPUs
    ("CUDA_VISIBLE_DEVICES", "0", ("CUDA_*",), "set by gpuflow"),    # not even through an operator's pattern
    ("RAY_ADDRESS", "evil:6379", ("*",), "set by gpuflow"),
    ("MYAPP_MODE", "fast", (), "not allowed"),
    ("MYAPP_MODE", "fast", ("MYAPP_*",), None),                      # the operator allowed the family
    ("A=B", "1", (), "not a variable name"),                         # '=' would split the entry
    ("A\x00B", "1", (), "not a variable name"),
    ("1ABC", "1", (), "not a variable name"),
    ("", "1", (), "not a variable name"),
    ("OMP_NUM_THREADS", "4\x00LD_PRELOAD=x", (), "NUL"),             # a NUL ends the C string
    ("OMP_NUM_THREADS", "x" * 40000, (), "longer than 32768 bytes"),
])
def test_env_allowlist(name, value, extra, problem):
    why = env_problem(name, value, extra)
    assert (why is None) if problem is None else (problem in why and (name in why or repr(name) in why)), why


@pytest.mark.parametrize("pattern,ok", [
    ("MYAPP_*", True), ("MY_VAR", True), ("*", False), ("LD_*PRELOAD", False), ("A?", False), ("", False),
])
def test_operator_patterns(pattern, ok):
    assert (allow_pattern_problem(pattern) is None) == ok


def test_launch_env_is_clean():
    agent = {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C", "LD_PRELOAD": "/evil.so", "AWS_SECRET": "s",
             "PYTHONPATH": "/x"}
    env = launch_env({"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "1", "PATH": "/tmp/bin"}, agent)
    # base (agent's PATH wins over anything given) + what was given; nothing else of the agent's
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C", "OMP_NUM_THREADS": "2",
                   "CUDA_VISIBLE_DEVICES": "1"}
    assert launch_env({}, {})["PATH"] == os.defpath  # no PATH at all: the system default


@pytest.mark.parametrize("backend,params,problem", [
    ("vllm", ["--max-model-len", "4096"], None),
    ("vllm", ["--tensor-parallel-size=2"], None),                  # a placement input, spelled as read
    ("vllm", ["--gpu-memory-utilization", "0.8"], None),
    ("vllm", ["--port", "80"], "sets --port"),
    ("vllm", ["--port=80"], "sets --port"),
    ("vllm", ["--po", "80"], "sets --port"),                        # argparse takes the prefix
    ("vllm", ["--host", "0.0.0.0"], "sets --host"),
    ("vllm", ["--served_model_name", "x"], "sets --served-model-name"),  # vLLM reads '_' as '-'
    ("vllm", ["--model", "/other"], "sets --model"),
    ("vllm", ["--config", "/m/evil.yaml"], "sets --config"),        # more flags from a file
    ("vllm", ["--kv-cache-memory-bytes", "80G"], "sets --kv-cache-memory-bytes"),  # beyond the booked share
    ("vllm", ["--allowed-local-media-path=/"], "sets --allowed-local-media-path"),  # clients read host files
    ("vllm", ["--gpu-memory-util", "0.99"], "abbreviates --gpu-memory-utilization"),  # unread by the scheduler
    ("vllm", ["--tensor-parallel", "8"], "abbreviates --tensor-parallel-size"),
    ("sglang", ["--model-path", "/other"], "sets --model-path"),
    ("sglang", ["--mem-fraction", "0.99"], "abbreviates --mem-fraction-static"),
    ("sglang", ["--nnodes", "2"], "sets --nnodes"),
    ("sglang", ["--tp", "2"], None),
    ("llama.cpp", ["-c", "4096", "-ngl", "10"], None),
    ("llama.cpp", ["--alias", "other"], "sets --alias"),             # the deployment's name is served
    ("llama.cpp", ["--rpc", "10.0.0.9:1"], "sets --rpc"),
    ("llama.cpp", ["-m", "/etc/shadow"], "sets -m"),
    ("llama.cpp", ["--log-file", "/root/.bashrc"], "sets --log-file"),  # writes anywhere
    ("llama.cpp", ["--n_gpu_layers", "99"], "sets --n_gpu_layers"),    # llama-cpp-python's spelling
    ("llama.cpp", ["--po", "1"], None),                              # llama-server takes exact flags only
    ("vllm", ["; rm -rf /"], None),                                  # one argv word, never a shell
    ("vllm", ["-1"], None),                                          # a value, not a flag
])
def test_owned_flags(backend, params, problem):
    got = flag_problems(backend, params)
    assert (got == []) if problem is None else (len(got) == 1 and problem in got[0]), got


@pytest.mark.parametrize("backend,params,flags", [
    ("vllm", ["--trust-remote-code"], ["--trust-remote-code"]),
    ("vllm", ["--trust_remote_code"], ["--trust_remote_code"]),
    ("vllm", ["--trust-remote-code=true"], ["--trust-remote-code=true"]),
    ("vllm", ["--trust-rem"], ["--trust-rem"]),                           # an abbreviation argparse accepts
    ("vllm", ["--tool-parser-plugin", "/m/p.py"], ["--tool-parser-plugin"]),  # loads a Python file
    ("sglang", ["--trust-remote-code"], ["--trust-remote-code"]),
    ("sglang", ["--enable-custom-logit-processor"], ["--enable-custom-logit-processor"]),
    ("vllm", ["--no-trust-remote-code"], []),                             # turns it off
    ("llama.cpp", ["--trust-remote-code"], []),                           # llama.cpp runs no model code
])
def test_remote_code_flags(backend, params, flags):
    assert remote_code_flags(backend, params) == flags


@pytest.mark.parametrize("name,ok", [
    ("legit", True), ("legit-0", True), ("Qwen2.5-7B_instruct", True), ("a" * 200, True),
    ("../x", False), ("..", False), ("a/b", False), (".hidden", False), ("-flag", False), ("", False),
    ("a\x00b", False), ("a b", False), ("a" * 201, False), (7, False),
])
def test_names(name, ok):
    assert (name_problem(name) is None) == ok


def test_paths_stay_in_their_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert path_in(str(run), "m-0@rpc0", ".json") == str(run / "m-0@rpc0.json")
    for bad in ("../../x", "m-0@../x", "m-0@a@b"):
        with pytest.raises(InvalidInput):
            path_in(str(run), bad, ".json")
    os.symlink("/etc", run / "sneaky")  # a valid name whose file resolves elsewhere
    with pytest.raises(InvalidInput, match="does not resolve inside"):
        path_in(str(run), "sneaky", "")
    assert check_key("m-0") == "m-0"


@pytest.mark.parametrize("field,value,problem", [
    ("env", {"LD_PRELOAD": "/x.so"}, "env LD_PRELOAD is not allowed"),
    ("env", {"CUDA_VISIBLE_DEVICES": "0"}, "env CUDA_VISIBLE_DEVICES is set by gpuflow"),
    ("backend_parameters", ["--port", "1"], "'--port' sets --port"),
    ("name", "../x", "name"),
    ("name", "x" * 129, "name"),  # instances are NAME-<n>: room for the suffix
])
def test_spec_refuses(field, value, problem):
    raw = {"name": "m", "source": {"local_path": "/m"}, "backend": "vllm", field: value}
    with pytest.raises(ValidationError, match=problem):
        ModelSpec.model_validate(raw)


def test_operator_patterns_reach_spec_validation():
    raw = {"name": "m", "source": {"local_path": "/m"}, "backend": "vllm", "env": {"MYAPP_MODE": "x"}}
    with pytest.raises(ValidationError):
        ModelSpec.model_validate(raw)
    assert ModelSpec.model_validate(raw, context={"allow_env": ["MYAPP_*"]}).env == {"MYAPP_MODE": "x"}


@pytest.mark.parametrize("hub,ok", [
    ({"repo": "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "file": "*q4_k_m.gguf"}, True),
    ({"repo": "gpt2"}, True),
    ({"repo": "org/name", "file": "sub/dir/model.gguf"}, True),
    ({"repo": "../../etc"}, False),                       # becomes folders in the host's model cache
    ({"repo": "org/../../x"}, False),
    ({"repo": "a/b/c"}, False),
    ({"repo": "org/name", "file": "../../../root/.bashrc"}, False),
    ({"repo": "org/name", "file": "/etc/passwd"}, False),
    ({"repo": "org/name", "file": "a//b"}, False),
])
def test_hub_names_stay_names(hub, ok):
    raw = {"name": "m", "source": {"huggingface": hub}, "backend": "vllm"}
    if ok:
        ModelSpec.model_validate(raw)
    else:
        with pytest.raises(ValidationError, match="repo|file"):
            ModelSpec.model_validate(raw)


def test_a_hub_listing_cannot_write_outside_the_cache(tmp_path):
    from worker_agent.downloads import NotOnHub, _inside

    cache = tmp_path / "models"
    assert _inside(str(cache), str(cache / "huggingface" / "org" / "name" / "abc"))
    with pytest.raises(NotOnHub, match="does not resolve inside"):
        _inside(str(cache / "f"), str(cache / "f" / ".." / ".." / "x.gguf"))  # a file name a hub listed


def test_engine_flags_read_only_the_models_files(tmp_path):
    """On the host: a parameter naming an existing file or folder must lie in the model's folder
    (or a --model-root); words that name nothing on this host (an inline template) pass."""
    from worker_agent.engines import EngineConfig, host_file_problems
    from contracts.agent import LaunchRequest

    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "chat.jinja").write_text("{{ messages }}")
    (tmp_path / "secret").write_text("s3cr3t")
    os.symlink(tmp_path / "secret", model / "sneaky.jinja")  # inside by name, outside once resolved

    def problems(*params: str, roots: tuple[str, ...] = ()) -> list[str]:
        r = LaunchRequest(instance="m-0", model="m", backend="vllm", model_path=str(model),
                          backend_parameters=list(params))
        return host_file_problems(r, EngineConfig(model_roots=roots))

    assert problems("--chat-template", str(model / "chat.jinja")) == []
    assert problems("--chat-template", "{{ messages[0]['content'] }} / done") == []  # not a path here
    assert problems("--max-model-len", "4096") == []
    assert len(problems("--chat-template", "/etc/passwd")) == 1                # echoed back to clients
    assert len(problems(f"--chat-template={model}/../../secret")) == 1
    assert len(problems("--chat-template", str(model / "sneaky.jinja"))) == 1
    assert len(problems("--lora-modules", f"a={tmp_path}")) == 1                 # NAME=PATH forms too
    assert problems("--tokenizer", str(tmp_path / "secret"), roots=(str(tmp_path),)) == []  # the operator's root

"""Every engine flag that takes a Hugging Face repository or a URL (issue 40, M4: vLLM
``--generation-config evilorg/evilrepo`` reached the engine, which fetched it from the hub).

The table below is every such flag of vLLM 0.11.0, SGLang 0.5.3 and the llama-server that
llama-cpp-python 0.3.36 vendors (and llama-cpp-python's own), read from their sources, with how
each is refused: a listed **hub flag** (scheduler/engine_flags/kinds.py: the engine downloads a
value naming no local file) takes only a value written as a path, inside the model's folder or a
--model-root; the others are owned, network, off the list, or not a choice. Each row is refused
at spec validation and at the agent, naming the flag; the path forms a hub flag accepts follow."""

from __future__ import annotations

import json

import pytest

from contracts.agent import LaunchRequest
from scheduler.engine_flags import ENGINES, spec_flag_problems
from worker_agent.engines import EngineConfig, LaunchRefused, check_launch

REPO = "evilorg/evilrepo"
URL = "https://evil.example/x"

# (backend, backend_parameters, the flag named, how: hub | owned | network | unlisted | choice | url)
TABLE = [
    # vLLM 0.11.0: where it downloads (source) -> why refused
    ("vllm", ["--generation-config", REPO], "--generation-config", "hub"),  # M4: config/model.py try_get_generation_config
    ("vllm", ["--generation-config", "evilrepo"], "--generation-config", "hub"),  # a bare name is a repository too
    ("vllm", ["--tokenizer", REPO], "--tokenizer", "hub"),  # transformers_utils/tokenizer.py
    ("vllm", ["--hf-config-path", REPO], "--hf-config-path", "hub"),  # transformers_utils/config.py get_config
    ("vllm", ["--speculative-config", json.dumps({"method": "eagle", "model": REPO})], "--speculative-config", "hub"),
    ("vllm", ["--lora-modules", f"a={REPO}"], "--lora-modules", "hub"),  # lora/utils.py get_adapter_absolute_path
    ("vllm", ["--lora-modules", json.dumps({"name": "a", "path": REPO})], "--lora-modules", "hub"),
    ("vllm", ["--lora-modules", "~/lora"], "--lora-modules", "hub"),  # vLLM expands '~': written as no path of ours
    ("vllm", ["--default-mm-loras", json.dumps({"image": REPO})], "--default-mm-loras", "unlisted"),
    ("vllm", ["--model", REPO], "--model", "owned"),
    ("vllm", ["--download-dir", "/tmp/hub"], "--download-dir", "owned"),
    ("vllm", ["--revision", "main"], "--revision", "network"),
    ("vllm", ["--code-revision", "main"], "--code-revision", "network"),
    ("vllm", ["--tokenizer-revision", "main"], "--tokenizer-revision", "network"),
    ("vllm", ["--hf-token", "hf_x"], "--hf-token", "network"),
    ("vllm", ["--tool-server", "evil.example:80"], "--tool-server", "network"),
    ("vllm", ["--otlp-traces-endpoint", URL], "--otlp-traces-endpoint", "network"),
    ("vllm", ["--allowed-media-domains", "evil.example"], "--allowed-media-domains", "network"),
    ("vllm", ["--chat-template", URL], "--chat-template", "url"),
    ("vllm", ["--model-loader-extra-config", json.dumps({"url": URL})], "--model-loader-extra-config", "unlisted"),
    ("vllm", ["--kv-transfer-config", json.dumps({"kv_ip": "evil.example"})], "--kv-transfer-config", "unlisted"),
    ("vllm", ["--load-format", "runai_streamer"], "--load-format", "choice"),  # s3:// and gs:// weights
    ("vllm", ["--override-generation-config", json.dumps({"x": URL})], "--override-generation-config", "url"),
    # SGLang 0.5.3
    ("sglang", ["--tokenizer-path", REPO], "--tokenizer-path", "hub"),  # utils/hf_transformers_utils.py get_tokenizer
    ("sglang", ["--speculative-draft-model-path", REPO], "--speculative-draft-model-path", "hub"),
    ("sglang", ["--speculative-draft-model", REPO], "--speculative-draft-model", "unlisted"),  # its alias
    ("sglang", ["--speculative-token-map", f"{REPO}/hot.pt"], "--speculative-token-map", "hub"),  # eagle_worker.py
    ("sglang", ["--lora-paths", REPO], "--lora-paths", "hub"),  # lora/lora_config.py snapshot_download
    ("sglang", ["--lora-paths", f"a={REPO}"], "--lora-paths", "hub"),
    ("sglang", ["--lora-paths", json.dumps({"lora_name": "a", "lora_path": REPO})], "--lora-paths", "hub"),
    ("sglang", ["--model-path", REPO], "--model-path", "owned"),
    ("sglang", ["--download-dir", "/tmp/hub"], "--download-dir", "owned"),
    ("sglang", ["--revision", "main"], "--revision", "network"),
    ("sglang", ["--speculative-draft-model-revision", "main"], "--speculative-draft-model-revision", "network"),
    ("sglang", ["--tool-server", "evil.example:80"], "--tool-server", "network"),
    ("sglang", ["--oltp-traces-endpoint", "evil.example:4317"], "--oltp-traces-endpoint", "network"),
    ("sglang", ["--remote-instance-weight-loader-seed-instance-ip", "10.0.0.9"],
     "--remote-instance-weight-loader-seed-instance-ip", "network"),
    ("sglang", ["--load-format", "remote"], "--load-format", "choice"),
    ("sglang", ["--chat-template", URL], "--chat-template", "url"),
    ("sglang", ["--model-loader-extra-config", json.dumps({"url": URL})], "--model-loader-extra-config", "unlisted"),
    ("sglang", ["--hicache-storage-backend", "mooncake"], "--hicache-storage-backend", "unlisted"),
    # llama-server (common/arg.cpp) and llama-cpp-python's server (llama_cpp/server/settings.py)
    *[("llama.cpp", [f, REPO], f, "network") for f in ("-hf", "-hfr", "--hf-repo", "-hfd", "-hfrd", "--hf-repo-draft",
                                                      "--spec-draft-hf", "-dr", "--docker-repo")],
    *[("llama.cpp", [f, "m.gguf"], f, "network") for f in ("-hff", "--hf-file")],
    *[("llama.cpp", [f, "hf_x"], f, "network") for f in ("-hft", "--hf-token")],
    *[("llama.cpp", [f, URL], f, "network") for f in ("-mu", "--model-url", "-mmu", "--mmproj-url")],
    ("llama.cpp", ["--mcp-servers-json", json.dumps({"s": URL})], "--mcp-servers-json", "network"),
    ("llama.cpp", ["-m", URL], "-m", "owned"),
    ("llama.cpp", ["--hf_model_repo_id", REPO], "--hf_model_repo_id", "owned"),
    ("llama.cpp", ["--hf_pretrained_model_name_or_path", REPO], "--hf_pretrained_model_name_or_path", "owned"),
    ("llama.cpp", ["-md", URL], "-md", "url"),
    ("llama.cpp", ["--lora", URL], "--lora", "url"),
    ("llama.cpp", ["--chat-template-file", URL], "--chat-template-file", "url"),
    ("llama.cpp", ["--mmproj", URL], "--mmproj", "url"),
]


@pytest.fixture
def host(tmp_path, monkeypatch):
    """models/ (the agent's --model-root) with m/ (the model's folder: a tokenizer, a draft, a
    LoRA, a generation config, a token map, and a folder named like the repository) and shared/."""
    model = tmp_path / "models" / "m"
    for d in (model / "tok", model / "draft", model / "lora", model / "gen", model / "evilorg" / "evilrepo",
              tmp_path / "models" / "shared", tmp_path / "agent"):
        d.mkdir(parents=True)
    for f in (model / "m.gguf", model / "hot.pt"):
        f.write_text("x")
    monkeypatch.chdir(tmp_path / "agent")
    return tmp_path


def at_agent(host, backend: str, params: list[str]) -> list[str]:
    model = host / "models" / "m"
    req = LaunchRequest(instance="m-0", model="m", backend=backend, backend_parameters=params,
                        model_path=str(model / "m.gguf" if backend == "llama.cpp" else model))
    return check_launch(req, EngineConfig(model_roots=(str(host / "models"),)))


@pytest.mark.parametrize("backend,params,flag,how", TABLE, ids=[f"{r[0]}{r[1][0]}-{r[3]}" for r in TABLE])
def test_refused_at_validation_naming_the_flag(backend, params, flag, how):
    got = spec_flag_problems(backend, params, extra=())
    assert got and flag in got[0], got


@pytest.mark.parametrize("backend,params,flag,how", TABLE, ids=[f"{r[0]}{r[1][0]}-{r[3]}" for r in TABLE])
def test_refused_at_the_agent_naming_the_flag(host, backend, params, flag, how):
    """Even where a folder of the repository's name lies in the model's folder (evilorg/evilrepo
    there): written as no path, it is refused, as at validation."""
    with pytest.raises(LaunchRefused) as e:
        at_agent(host, backend, params)
    assert flag in str(e.value), str(e.value)


def test_the_table_holds_every_hub_flag():
    """A flag listed as a hub flag has a row here (so it is tested refused), and every row's
    'how' is what the lists say (a listed flag is refused by its hub rule, not by accident)."""
    listed = {(b, f) for b, rules in ENGINES.items() for f, rule in rules.ALLOW.items() if rule.hub}
    assert listed == {(b, f) for b, _, f, how in TABLE if how == "hub"}
    for backend, _, flag, how in TABLE:
        rules = ENGINES[backend]
        where = ("owned" if flag in rules.OWNED else "network" if flag in rules.NETWORK else
                 "unlisted" if flag not in rules.ALLOW else "listed")
        assert where == {"hub": "listed", "choice": "listed", "url": "listed"}.get(how, how), (backend, flag)


# the path forms a hub flag accepts: (params as written, what the engine gets; M: the model's folder, R: the root)
ACCEPTED = [
    ("vllm", ["--generation-config", "auto"], ["--generation-config", "auto"]),  # vLLM's own words
    ("vllm", ["--generation-config", "vllm"], ["--generation-config", "vllm"]),
    ("vllm", ["--generation-config", "./gen"], ["--generation-config", "M/gen"]),
    ("vllm", ["--tokenizer", "./tok"], ["--tokenizer", "M/tok"]),
    ("vllm", ["--tokenizer", "R/shared"], ["--tokenizer", "R/shared"]),  # absolute, under the --model-root
    ("vllm", ["--hf-config-path", "./evilorg/evilrepo"], ["--hf-config-path", "M/evilorg/evilrepo"]),
    ("vllm", ["--lora-modules", "a=./lora", json.dumps({"name": "b", "path": "./lora"})],
     ["--lora-modules", "a=M/lora", json.dumps({"name": "b", "path": "M/lora"})]),
    ("vllm", ["--speculative-config", json.dumps({"method": "eagle", "model": "./draft"})],
     ["--speculative-config", json.dumps({"method": "eagle", "model": "M/draft"})]),
    ("sglang", ["--tokenizer-path", "./tok", "--speculative-draft-model-path", "./draft"],
     ["--tokenizer-path", "M/tok", "--speculative-draft-model-path", "M/draft"]),
    ("sglang", ["--speculative-token-map", "./hot.pt", "--lora-paths", "./lora", "a=R/shared"],
     ["--speculative-token-map", "M/hot.pt", "--lora-paths", "M/lora", "a=R/shared"]),
]


@pytest.mark.parametrize("backend,params,passed", ACCEPTED)
def test_path_forms_pass_with_files_resolved(host, backend, params, passed):
    m, r = str(host / "models" / "m"), str(host / "models")
    params = [p.replace("R/", r + "/") for p in params]
    assert spec_flag_problems(backend, params, extra=()) == []
    assert at_agent(host, backend, params) == [p.replace("M/", m + "/").replace("R/", r + "/") for p in passed]


@pytest.mark.parametrize("params,at_validation,at_agent_why", [
    (["--tokenizer", "./missing"], None, "is not a file"),  # written as a path, but there is none: never the hub
    (["--tokenizer", "/etc"], None, "outside"),  # absolute: the agent's to judge (outside the folder and roots)
    (["--generation-config", "./../../outside"], "climbs out", "is not a file"),  # '..' out of the model's folder
])
def test_written_as_a_path_is_still_checked_as_a_file(host, params, at_validation, at_agent_why):
    problems = spec_flag_problems("vllm", params, extra=())
    assert (problems and at_validation in problems[0]) if at_validation else problems == [], problems
    with pytest.raises(LaunchRefused, match=at_agent_why):
        at_agent(host, "vllm", params)

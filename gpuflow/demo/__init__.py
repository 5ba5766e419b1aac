"""The demos: the dry-run one (``gpuflow demo``, dryrun), the live one (``gpuflow dev --demo``,
live) with its real model (llm), and the synthetic model files both write (synthetic)."""

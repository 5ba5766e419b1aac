"""Hugging Face model directories: config.json, safetensors headers, and GPUStack's claims."""

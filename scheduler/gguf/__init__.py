"""GGUF models: a bounded header reader and llama.cpp's memory model (as gguf-parser-go computes it)."""

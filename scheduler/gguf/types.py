"""GGML tensor types: (block size, bytes per block), as gguf-parser-go's table has them.

Q8_1 is 36 bytes per block here (gguf-parser) where gguf-py says 40; we follow the parser whose
figures GPUStack uses.
"""

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    31: ("Q4_0_4_4", 32, 18), 32: ("Q4_0_4_8", 32, 18), 33: ("Q4_0_8_8", 32, 18),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 36: ("IQ4_NL_4_4", 32, 18),
    37: ("IQ4_NL_4_8", 32, 18), 38: ("IQ4_NL_8_8", 32, 18), 39: ("MXFP4", 32, 17),
}

BY_NAME: dict[str, int] = {name.lower(): tid for tid, (name, _, _) in GGML_TYPES.items()}

# Cache types llama.cpp accepts for --cache-type-k/-v.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
QUANTIZED_CACHE_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})


def row_size(type_id: int, dims: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of ``type_id`` with ggml dims (ne0 first): ts * ne0 / bs * ne1 * ..."""
    _, block, size = GGML_TYPES[type_id]
    n = size * dims[0] // block
    for d in dims[1:]:
        n *= d
    return n


def cache_row_size(cache_type: str, dims: list[int]) -> int:
    return row_size(BY_NAME[cache_type], dims)


F32 = 0
F16 = 1
I32 = 26

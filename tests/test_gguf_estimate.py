"""llama.cpp memory model against reference figures (estimation.md §1, §4, §5)."""


import pytest

from scheduler.gguf.estimate import LlamaCppOptions, estimate, estimate_item, estimate_items, gpustack_options
from scheduler.gguf.model import load_model
from scheduler.gguf.reader import read_header
from scheduler.units import GiB, MiB


@pytest.fixture(scope="module")
def smol(smollm2):
    return load_model(read_header(smollm2))


@pytest.fixture(scope="module")
def llama3(llama3_gguf):
    return load_model(read_header(llama3_gguf))


def test_smollm2_header_facts(smol):
    # real file: llama arch, 30 layers, ctx 8192, embd 576, 9 heads / 3 kv, vocab 49152, 272 tensors,
    # data at 1,785,664 (+32: gguf-parser pads a full block when aligned), tied embeddings
    m = smol
    assert (m.architecture, m.n_layer, m.n_ctx_train, m.n_embd, m.n_head, m.n_head_kv) == ("llama", 30, 8192, 576, 9, 3)
    assert (m.n_vocab, m.tokens, m.merges, m.n_tensors) == (49152, 49152, 48900, 272)
    assert m.size - m.model_size == 1_785_664 + 32
    assert not m.has_output_weight


def test_smollm2_matches_reference_port_byte_for_byte(smol):
    # estimation.md §4: default ctx (trained 8192), mmap, footprint 150/250 MiB:
    # VRAM NonUMA 821,800,192 B; RAM NonUMA 212,467,200 B
    it = estimate_item(smol, LlamaCppOptions())
    assert it.vrams[0].nonuma == 821_800_192
    assert it.ram.nonuma == 212_467_200
    assert it.offload_layers == 31 and it.full_offloaded  # 30 layers + output layer


def test_r1_llama3_8b_q5_k_m(llama3):
    # R1: ctx 8192, full offload, mmap, 150/250: VRAM 1.25 GiB UMA / 7.04 GiB NonUMA.
    # NonUMA = 250 MiB + output buffer 4*512*(4096+128256) + weights 5,363,982,336 (layers + output)
    #        + KV 2*8192*8*128*2*32 = 1 GiB + compute (5.27 MiB graph + 24 MiB inputs + 536 MiB attention)
    it = estimate_item(llama3, LlamaCppOptions(ctx_size=8192))
    assert it.vrams[0].nonuma / GiB == pytest.approx(7.04, abs=0.01)
    assert it.vrams[0].uma / GiB == pytest.approx(1.25, abs=0.01)
    # RAM differs from the README's 360.80 MiB (our tokens are shorter than the real ones, and that
    # README example also carried an adapter); it is the footprint + CPU compute only.
    assert 300 * MiB < it.ram.nonuma < 370 * MiB


def test_kv_cache_per_token_r13(smol, llama3):
    # R13: f16 KV per token = 2 * layers * kv_heads * head_dim * 2 B: Llama-3-8B 131,072; SmolLM2 23,040
    for m, per_token in ((llama3, 131_072), (smol, 23_040)):
        a = estimate(m, LlamaCppOptions(ctx_size=1024))
        assert a.devices[1].kv == per_token * 1024


def test_step_items_cover_every_offload_count(smol):
    # --gpu-layers-step 1: items for 0..30 layers, then the full run (31 = 30 + output layer)
    items = estimate_items(smol, gpustack_options(), step=1)
    assert [i.offload_layers for i in items] == list(range(31)) + [31]
    assert [i.full_offloaded for i in items] == [False] * 31 + [True]
    vram = [i.vrams[0].nonuma for i in items]
    assert vram == sorted(vram)  # each offloaded layer costs VRAM
    ram = [i.ram.nonuma for i in items[:-1]]
    assert ram == sorted(ram, reverse=True)  # and saves RAM (no mmap)


def test_gpustack_defaults_cost_more_than_cli_defaults(smol):
    # GPUStack passes --mmap=false, 4 parallel slots and 500 MiB VRAM footprint
    cli, gs = estimate_item(smol, LlamaCppOptions(ctx_size=8192)), estimate_item(smol, gpustack_options())
    assert gs.vrams[0].nonuma - cli.vrams[0].nonuma == 250 * MiB
    assert gs.ram.nonuma > cli.ram.nonuma


def test_tensor_split_and_rpc(llama3):
    # split 1:1 over two GPUs: 32 layers + output spread by upper_bound over cumulative [0.5, 1]
    it = estimate_item(llama3, LlamaCppOptions(ctx_size=8192, tensor_split=(1, 1)))
    assert [v.handle_layers for v in it.vrams] == [17, 15]
    assert it.vrams[1].handle_output_layer
    one = estimate_item(llama3, LlamaCppOptions(ctx_size=8192))
    assert sum(v.nonuma for v in it.vrams) > one.vrams[0].nonuma  # inputs are 4x per GPU when split
    r = estimate_item(llama3, LlamaCppOptions(ctx_size=8192, tensor_split=(1, 1), rpc=("h:50052",)))
    assert [v.remote for v in r.vrams] == [True, False] and [v.position for v in r.vrams] == [0, 0]


def test_options_change_the_figures_in_the_right_direction(llama3):
    base = estimate_item(llama3, LlamaCppOptions(ctx_size=8192))
    q8 = estimate_item(llama3, LlamaCppOptions(ctx_size=8192, cache_type_k="q8_0", cache_type_v="q8_0", flash_attention=True))
    assert q8.vrams[0].nonuma < base.vrams[0].nonuma
    nommap = estimate_item(llama3, LlamaCppOptions(ctx_size=8192, mmap=False, gpu_layers=10))
    mmap = estimate_item(llama3, LlamaCppOptions(ctx_size=8192, gpu_layers=10))
    assert nommap.ram.nonuma - mmap.ram.nonuma > 1 * GiB  # 22 layers' weights held in RAM
    small = estimate_item(llama3, LlamaCppOptions(ctx_size=2048))
    assert base.vrams[0].nonuma - small.vrams[0].nonuma > 0.75 * GiB  # 6144 tokens of KV = 0.75 GiB


def test_gpu_layers_equal_to_block_count_is_not_full(llama3):
    # gguf-parser: --gpu-layers 32 on 32 layers keeps the output layer on the CPU
    it = estimate_item(llama3, LlamaCppOptions(gpu_layers=32))
    assert it.offload_layers == 32 and not it.full_offloaded
    assert estimate_item(llama3, LlamaCppOptions(gpu_layers=33)).full_offloaded


def test_sliding_window_shrinks_kv(tmp_path):
    from gpuflow.demo.synthetic import write_llama_gguf

    kw = dict(n_layer=6, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=512, ctx=32768, recipe="F16")
    plain = load_model(read_header(write_llama_gguf(str(tmp_path / "a.gguf"), arch="llama", **kw)))
    swa = load_model(read_header(write_llama_gguf(str(tmp_path / "b.gguf"), arch="gemma2", sliding_window=4096, **kw)))
    assert swa.swa_pattern == 2 and swa.swa == 4096
    # gemma2: odd layers use min(n_kv, pad(4096*1 + 2048, 32)) = 6144 tokens instead of 32768
    a, b = estimate(plain, LlamaCppOptions()), estimate(swa, LlamaCppOptions())
    per_tok = 2 * 2 * 64 * 2  # k+v, kv heads, head dim, f16
    assert a.devices[1].kv == per_tok * 32768 * 6
    assert b.devices[1].kv == per_tok * (32768 * 3 + 6144 * 3)
    # more parallel sequences widen the window: 4096*4 + 2048 = 18432
    c = estimate(swa, LlamaCppOptions(parallel_size=4))
    assert c.devices[1].kv == per_tok * (32768 * 3 + 18432 * 3)

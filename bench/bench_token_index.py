"""The KV-events index (gateway/token_index.py) at its cap: what it costs the gateway's memory and
CPU. Four replicas whose engines publish 32-byte block hashes (vLLM's form) fill the index to
``MAX_TOTAL`` blocks, then keep storing, so every new block evicts an old one. Prints the gateway
process's resident memory grown by the index (RSS, not the allocator's count: what an operator
sees) and the time per 100,000 blocks stored, before and at the cap.

    .venv/bin/python bench/bench_token_index.py [--blocks N]"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

from gateway.kv_events import Batch, Stored
from gateway.token_index import MAX_TOTAL, TokenIndex

PER_BATCH = 50  # blocks per stored event
REPLICAS = 4


def rss_mib() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def fill(ix: TokenIndex, rnd: random.Random, blocks: int) -> float:
    """Store ``blocks`` new blocks spread over the replicas; seconds taken."""
    toks = tuple(range(PER_BATCH * 16))
    batches = []
    for r in range(REPLICAS):
        parent = None
        for _ in range(blocks // REPLICAS // PER_BATCH):
            hs = tuple(rnd.randbytes(32) for _ in range(PER_BATCH))
            batches.append((f"r{r}", Batch(0.0, (Stored(hs, parent, toks, 16),))))
            parent = hs[-1]
    t0 = time.perf_counter()
    for name, b in batches:
        ix.apply(name, b)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=MAX_TOTAL, help=f"the index's cap (default {MAX_TOTAL:,})")
    a = p.parse_args()
    rnd, base = random.Random(1), rss_mib()
    ix = TokenIndex(capacity=a.blocks, max_total=a.blocks)
    up = fill(ix, rnd, a.blocks)
    gc.collect()
    at_cap = rss_mib() - base
    churn = fill(ix, rnd, a.blocks)
    gc.collect()
    print(f"index of {ix.total:,} blocks over {REPLICAS} replicas (32-byte engine hashes)")
    print(f"  filling:   {up / a.blocks * 1e5:.2f} s per 100k blocks; RSS grown {at_cap} MiB")
    print(f"  at the cap (each block stored evicts one): {churn / a.blocks * 1e5:.2f} s per 100k blocks; "
          f"RSS grown {rss_mib() - base} MiB ({(rss_mib() - base) * 2**20 / ix.total:.0f} bytes a block)")


if __name__ == "__main__":
    main()

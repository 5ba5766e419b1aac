"""The stand-in engine's simulated GPU (issue 35): one per process, a continuous-batching loop in
the spirit of vLLM's scheduler and Dynamo's mocker, with no model. It is what makes a long local
prefill stall every running decode on an aggregated replica, the interference disaggregation
removes.

Each step is either one chunk of one prefill (at most ``chunk`` tokens, ``prefill_token_s`` a
token: compute-bound, so proportional to the tokens) or one decode step for every running
sequence (``step_s``: memory-bound, about the same for 1 or 100 sequences). A prefill's last chunk
samples the sequence's first token; each decode step gives every running sequence one more. While
prefills wait, steps alternate (a chunk, then a decode step), so a running sequence waits at most
one chunk between tokens: with chunk 2048 tokens at 0.1 ms a token, a decode on an aggregated
replica sees 205 ms gaps where a decode-only replica sees ``step_s``.

A sequence whose KV came from elsewhere (a remote prefill) enters with nothing to prefill: it is
admitted straight into the running batch and its first token comes at the next decode step.
Admission is FIFO and needs the sequence's KV blocks (prompt and answer, ``block_tokens`` a block)
free among ``kv_blocks``; a prefill's blocks may outlive its sequence (``keep``): the KV hand-off
(pd_kv.py) holds them until a decode pulls them, and then releases them here."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

DONE = None  # what a sequence's queue carries last


@dataclass(eq=False)
class Seq:
    """One request on the GPU. ``out`` gets the monotonic time of each token, then DONE."""
    prompt_tokens: int
    max_tokens: int
    blocks: int
    to_prefill: int  # tokens still to compute here (0: its KV came from a remote prefill)
    keep: bool = False  # its blocks outlive it (a prefill whose KV a decode will pull)
    arrived: float = field(default_factory=time.monotonic)
    generated: int = 0
    admitted: bool = False
    cancelled: bool = False
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)


def blocks_for(tokens: int, block_tokens: int) -> int:
    return max(1, math.ceil(tokens / block_tokens))


class Gpu:
    """The loop runs in its own thread (``start``); ``submit`` and ``cancel`` come from request
    threads. ``on_token(seq, t)`` is called for each token, in the loop's thread."""

    def __init__(self, prefill_token_s: float, step_s: float, chunk: int, max_seqs: int, kv_blocks: int,
                 on_token=None):
        self.prefill_token_s, self.step_s, self.chunk = prefill_token_s, step_s, max(1, chunk)
        self.max_seqs, self.kv_blocks = max(1, max_seqs), max(1, kv_blocks)
        self.on_token = on_token or (lambda seq, t: None)
        self.cond = threading.Condition()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.used = 0  # KV blocks booked: admitted sequences and kept (held) prefills
        self.last = "decode"
        self.steps = {"prefill": 0, "decode": 0}

    # -- from request threads ------------------------------------------------------------------
    def submit(self, seq: Seq) -> None:
        with self.cond:
            self.waiting.append(seq)
            self.cond.notify()

    def cancel(self, seq: Seq) -> None:
        with self.cond:
            seq.cancelled = True
            self.cond.notify()

    def release(self, blocks: int) -> None:
        """Blocks a kept prefill held, freed (its KV was pulled, or its hold expired)."""
        with self.cond:
            self.used = max(0, self.used - blocks)
            self.cond.notify()

    def usage(self) -> float:
        return self.used / self.kv_blocks

    def counts(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        with self.cond:
            return len(self.running) + sum(1 for s in self.waiting if s.admitted), \
                sum(1 for s in self.waiting if not s.admitted)

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.loop, name="standin-gpu", daemon=True)
        t.start()
        return t

    def loop(self) -> None:
        while True:
            with self.cond:
                step = self._pick()
                while step is None:
                    self.cond.wait()
                    step = self._pick()
            kind, seqs, n = step
            time.sleep(n * self.prefill_token_s if kind == "prefill" else self.step_s)
            with self.cond:
                self.last = kind
                self.steps[kind] += 1
                self._apply(kind, seqs, n)

    def _pick(self):
        """Under the lock: ("prefill", [seq], tokens), ("decode", running, 0) or None (idle)."""
        for s in [s for s in self.running if s.cancelled]:
            self._finish(s)
        head = self._admit()
        if head is not None and (not self.running or self.last == "decode"):
            return "prefill", [head], min(self.chunk, head.to_prefill)
        if self.running:
            return "decode", list(self.running), 0
        return None

    def _admit(self) -> Seq | None:
        """Admit waiting sequences in order while their blocks fit: a remote-prefilled one joins
        the running batch; the first that needs a prefill is returned (the one to work on)."""
        while self.waiting:
            s = self.waiting[0]
            if s.cancelled:
                self.waiting.popleft()
                if s.admitted:
                    self.used -= s.blocks
                s.out.put(DONE)
                continue
            if not s.admitted:
                if self.used + s.blocks > self.kv_blocks or len(self.running) >= self.max_seqs:
                    return None
                self.used += s.blocks
                s.admitted = True
            if s.to_prefill > 0:
                return s
            self.waiting.popleft()
            self.running.append(s)
        return None

    def _apply(self, kind: str, seqs: list[Seq], n: int) -> None:
        now = time.monotonic()
        if kind == "prefill":
            s = seqs[0]
            s.to_prefill -= n
            if s.to_prefill > 0 or s.cancelled:
                return
            self.waiting.remove(s)
            self._token(s, now)
            if s.generated < s.max_tokens:
                self.running.append(s)
            return
        for s in seqs:
            if s.cancelled or s not in self.running:
                continue
            self._token(s, now)

    def _token(self, s: Seq, now: float) -> None:
        s.generated += 1
        s.out.put(now)
        self.on_token(s, now)
        if s.generated >= s.max_tokens:
            self._finish(s)

    def _finish(self, s: Seq) -> None:
        if s in self.running:
            self.running.remove(s)
        if not s.keep or s.cancelled:
            self.used -= s.blocks
        s.out.put(DONE)

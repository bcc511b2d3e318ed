"""Nucleus (top-p) sampling without sorting the vocabulary: the evaluation's sampling warper.

The paper's evaluation samples k answers a problem at T = 1.0 with top-p 0.9 (avg@k, harness/evaluate.py).
transformers' TopPLogitsWarper sorts every row's whole vocabulary at every decode step: for SmolLM2's
49,152 tokens, 5.6 ms a row on one core of our 2-core AMD EPYC, more than that row's matmuls of a
decode step (~4.8 ms at 135M parameters): ~0.45 of the 1.67 CPU s a problem of the real-LM lab's
evaluation (8 samples x 10 steps a problem).
The nucleus is usually a handful of tokens, so only the top K are needed: torch.topk finds 256 of
them in ~0.2 ms a row. K = 256 measured on the lab's evaluation (SmolLM2, T = 1, top-p 0.9, 2,560
rows x steps): the nucleus held a median 7 tokens, more than 64 in 20% of rows, more than 256 in 3%
(those rows take the full sort), more than 1,024 in 0.2%.

Which tokens stay. transformers keeps the token at ascending rank j iff the mass of the tokens up to
and including it (ascending) is > 1 - top_p, and always the most likely one. That mass is 1 minus the
mass of the tokens ranked above it, so the rule is: keep the token at descending rank i iff the mass
ranked above it is < top_p. The same set in real arithmetic; in floats the two cumulative sums round
differently (~1e-7), so a token whose cumulative mass lies that close to the threshold can fall on the
other side (a ~1e-7 chance a row and step, the shared-prompt prefill's caveat). Kept logits are the
raw ones and the rest -inf, as transformers returns them, so the sampler's softmax and multinomial
draw are the same. A row whose top K hold less than top_p of the mass (a flat distribution: its
nucleus may reach past rank K) goes through transformers' warper instead.

Used by engines/rollout.hf_generate_greedy_and_sampled (the evaluation off the toy labs). Tests:
tests/test_speed.py (kept sets against TopPLogitsWarper, a flat row included; the evaluation's tokens).
"""
from __future__ import annotations

import torch


class TopPByTopK:
    """A logits processor doing temperature, then top-p, as transformers' two warpers do in that order.
    Give generate temperature=1.0 and top_p=1.0 with it, so that neither is applied twice."""

    def __init__(self, top_p: float, temperature: float = 1.0, k: int = 256):
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.top_p, self.temperature, self.k = top_p, temperature, k

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature != 1.0:
            scores = scores / self.temperature  # transformers' TemperatureLogitsWarper
        if self.top_p >= 1.0:
            return scores
        K = min(self.k, scores.shape[-1])
        top_logits, top_idx = scores.topk(K, dim=-1)  # (n, K), descending
        probs = (top_logits - torch.logsumexp(scores, dim=-1, keepdim=True)).exp()  # (n, K) of the full softmax
        above = probs.cumsum(-1) - probs  # (n, K): the mass ranked above each token
        keep = above < self.top_p
        keep[:, 0] = True  # the most likely token always stays (min_tokens_to_keep = 1)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, top_idx, top_logits.masked_fill(~keep, float("-inf")))
        wide = keep[:, -1]  # (n,): rank K kept, so the nucleus may go on past the top K
        if wide.any():
            from transformers.generation.logits_process import TopPLogitsWarper

            out[wide] = TopPLogitsWarper(self.top_p)(input_ids[wide], scores[wide])
        return out

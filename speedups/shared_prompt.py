"""--shared-prompt-forward: the loss forward with each distinct prompt run once, not once per rollout.

Accelerates grpo.per_token_logps (the plain version: every row's prompt and completion in one
forward); the same log-probs and gradients up to float rounding. Equivalence test:
tests/test_speed.py (test_shared_prompt_forward_*). Used by engines/update.py:policy_update.
"""
from __future__ import annotations

import torch

import grpo


def per_token_logps_shared_prompt(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                  logits_to_keep: int, micro_batch_size: int | None = None,
                                  temperature: float = 1.0, with_entropy: bool = False):
    """grpo.per_token_logps, with each distinct prompt of a micro-batch run once, not once per rollout.

    A GRPO batch repeats each prompt B_i times (G = 8 on the toy: 59% of its token positions are
    prompt). The completion tokens need the prompt's keys and values at every layer, but those
    depend on the prompt alone (causal attention: a prompt position never sees the completion),
    so they are the same for all B_i rows. Here, per micro-batch:
      1. the u distinct prompts (u <= n) run once, with gradient, into a KV cache (DynamicCache);
         their last logit predicts each row's first completion token;
      2. the cache is expanded to the n rows with an index (`reorder_cache`, an index_select:
         differentiable, so each row's gradient flows back into its prompt's single forward and
         the B_i contributions add up there, as they would across B_i copies);
      3. only the completion columns run, on top of that cache, at the positions the plain forward
         gives them (real tokens counted from each row's first prompt token).
    Same arguments, same result as grpo.per_token_logps up to float rounding: the same sums are
    formed in a different grouping (a batch of u rows instead of n, the attention over cache + new
    columns), which moves fp32 results by ~1e-7 relative, bf16 autocast ones by ~1e-2
    (tests/test_speed.py states the tolerances). The result does not depend on micro_batch_size,
    but the saving does: only rows of one prompt inside one micro-batch share its forward, so
    callers group a mini-batch's rows by prompt before splitting it (engines/update.policy_update).
    Needs a transformers causal LM (past_key_values, position_ids); other models, and a batch
    without repeated prompts, take grpo.per_token_logps' plain path. Gradient checkpointing turns
    the cache off inside transformers' layers, so train.py refuses that combination.
    """
    N, L = input_ids.shape
    T = int(logits_to_keep)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids {(N, L)}")
    if not 1 <= T < L:
        raise ValueError(f"logits_to_keep = T must be in [1, L - 1] = [1, {L - 1}], got {T}")
    if not {"past_key_values", "position_ids"} <= grpo._forward_params(model):
        return grpo.per_token_logps(model, input_ids, attention_mask, T, micro_batch_size, temperature, with_entropy)
    step = N if micro_batch_size is None else int(micro_batch_size)
    if step < 1:
        raise ValueError(f"micro_batch_size must be a positive number of rows or None, got {micro_batch_size}")
    parts = [_logps_rows_shared(model, input_ids[s:s + step], attention_mask[s:s + step], T, temperature,
                                with_entropy) for s in range(0, N, step)]
    logps = torch.cat([p[0] for p in parts])  # (N, T)
    return (logps, torch.cat([p[1] for p in parts])) if with_entropy else logps


def _logps_rows_shared(model, ids: torch.Tensor, mask: torch.Tensor, T: int, temperature: float,
                       with_entropy: bool):
    """One micro-batch of per_token_logps_shared_prompt: ids, mask (n, L) -> (n, T) each."""
    n, L = ids.shape
    P = L - T  # prompt columns (left-padded), then T completion columns (right-padded)
    # Rows of one prompt have identical left-padded prompt columns (ids and mask): deduplicate on
    # both, so a real token that equals the pad id can never merge two different prompts.
    key = torch.cat([ids[:, :P], mask[:, :P].to(ids.dtype)], 1)  # (n, 2P)
    distinct, row_prompt = torch.unique(key, dim=0, return_inverse=True)  # (u, 2P), (n,) prompt of each row
    if len(distinct) == n:  # nothing repeats: the plain forward is the same work in one call
        return grpo._logps_rows(model, ids, mask, T, temperature, with_entropy)
    p_ids, p_mask = distinct[:, :P], distinct[:, P:].to(mask.dtype)  # (u, P) each
    # Positions count real tokens only, exactly as in grpo._logps_rows (and as generation numbered them).
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (n, L)
    p_positions = (p_mask.long().cumsum(-1) - 1).clamp(min=0)  # (u, P)
    # 1. each distinct prompt once, with gradient; its last logit predicts completion token 0.
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_positions, use_cache=True,
                logits_to_keep=1)
    first = out.logits[:, -1:, :][row_prompt]  # (n, 1, V)
    if T == 1:
        return grpo._logps_from_logits(first, ids[:, -T:], temperature, with_entropy)
    # 2. each row gets its prompt's keys and values, layer by layer (index_select, differentiable).
    cache = out.past_key_values
    cache.reorder_cache(row_prompt)  # (u, heads, P, d) -> (n, heads, P, d) per layer
    # 3. the completion columns but the last (whose logit predicts past the row) on top of the
    # cache; the mask covers cache + new columns, as the plain forward's would.
    rest = model(input_ids=ids[:, P:L - 1], attention_mask=mask[:, :L - 1], position_ids=positions[:, P:L - 1],
                 past_key_values=cache, use_cache=True).logits  # (n, T-1, V)
    return grpo._logps_from_logits(torch.cat([first, rest], 1), ids[:, -T:], temperature, with_entropy)

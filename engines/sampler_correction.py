"""vLLM's sampler is not the trainer: truncated importance sampling and the logged log-prob gap.

With --use-vllm the rollouts are drawn by vLLM (its own bf16 kernels) while the loss's pi_old is
the trainer's recomputed log-prob, so the two differ by float noise. Off by default:
--vllm-importance-sampling-cap reweights each token's clipped surrogate (grpo.clipped_policy_loss's
token_weights) by truncated_importance_weights; with vLLM rollouts the gap is always logged
(vllm_logp_gap, vllm_is_weight_mean). Used by engines/update.py:policy_update. Shapes: N rows
(rollouts), T completion tokens. Tests: tests/test_grpo.py, tests/test_step.py (tis), tests/test_dist.py.
"""
from __future__ import annotations

import torch


def truncated_importance_weights(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor,
                                 completion_mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"; TRL's vllm_importance_sampling_correction, token_truncate):
    w_t = min(pi_trainer(o_t) / pi_sampler(o_t), cap), per token.

    The rollouts were drawn by the sampler (vLLM, bf16 kernels) but the loss's pi_old is the
    trainer's recomputed log-prob; w_t reweights each token towards the trainer's distribution,
    and the cap bounds the variance that a few tokens the sampler found unlikely would add.
    trainer_logps, sampler_logps, completion_mask: (N, T). Returns (N, T), 1.0 on padding.
    """
    if cap <= 0:
        raise ValueError(f"the importance-sampling cap must be > 0, got {cap}")
    m = completion_mask.bool()
    log_w = torch.where(m, trainer_logps.detach() - sampler_logps.to(trainer_logps.dtype),
                        torch.zeros_like(trainer_logps))  # (N, T)
    return torch.clamp(torch.exp(log_w), max=cap)  # (N, T)


def sampler_gap(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, completion_mask: torch.Tensor,
                cap: float | None = None) -> tuple[torch.Tensor | None, list[float]]:
    """vLLM rollouts (ours, logged): how far the trainer's log-probs at rollout time are from the
    sampler's, on one micro-batch. Returns (the TIS weights w_t (N, T), or None without a cap, and the
    sums [sum |log pi_trainer - log pi_sampler|, completion tokens, sum of w_t] over its completion
    tokens). Summed over micro-batches and ranks, then divided by the tokens, they are the batch's
    token means vllm_logp_gap and vllm_is_weight_mean. trainer_logps, sampler_logps, mask: (N, T)."""
    m = completion_mask.bool()
    sums = [float(torch.where(m, (trainer_logps - sampler_logps).abs(), 0.0).sum()), float(m.sum()), 0.0]
    weights = None
    if cap:
        weights = truncated_importance_weights(trainer_logps, sampler_logps, completion_mask, cap)  # (N, T)
        sums[2] = float(torch.where(m, weights, 0.0).sum())
    return weights, sums


def sampler_gap_means(gap_sum: float, tokens: float, weight_sum: float, cap: float | None = None) -> dict:
    """sampler_gap's sums over the whole batch -> the log's token means (each row is in exactly one
    mini-batch): vllm_logp_gap, and vllm_is_weight_mean with a cap; {} without sampler log-probs."""
    if not tokens:
        return {}
    return {"vllm_logp_gap": gap_sum / tokens, **({"vllm_is_weight_mean": weight_sum / tokens} if cap else {})}

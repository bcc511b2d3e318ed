"""GRPO on ragged groups: from (prompt, completions, rewards) to one scalar loss.

Everything between "a list of groups of (prompt, completions, rewards)" and `loss.backward()`,
one small function per equation, so a student can follow GRPO (DeepSeekMath, Shao et al. 2024,
arXiv 2402.03300, §4.1) and its common variants line by line; then the update around them:

    1. group_advantages   A_i = (r_i - mean(r_group)) / std(r_group)      DeepSeekMath §4.1.2
                          (no std division with scale_std=False: Dr. GRPO, arXiv 2503.20783)
    2. per_token_logps    log pi_theta(o_t | q, o_<t) for every completion token, prompt and
                          padding masked, micro-batched
    3. clipped_policy_loss
                          ratio_t = pi_theta / pi_old (the rollout policy), per token
                          -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
                          + beta * k3 KL to a frozen reference                DeepSeekMath eqs. 3-4
                          (eps_high > eps_low: DAPO's "clip-higher", arXiv 2503.14476 §3.1)
    4. aggregate_loss     "dapo"    token mean over the batch            (DAPO §3.3; CoBA App. C)
                          "grpo"    mean over each sequence's tokens, then over sequences (eq. 3)
                          "dr_grpo" sum / (N * max_completion_length)    (Dr. GRPO)
    5. policy_update      App. C's update of one step: the N rows in `num_mini_batches` shuffled
                          mini-batches, one optimizer step each, accumulated over micro-batches
                          (pi_old and pi_ref from no-grad forwards first: frozen_logps); under
                          torchrun this rank's rows of each (dist.micro_batches)

The CoBA-RL twist (arXiv 2602.03048, §2.1): prompt i gets its own number of rollouts B_i, so the
groups are ragged. Nothing here reshapes rewards into (M, G) as TRL does
(`rewards.view(-1, num_generations)`); every group statistic is a scatter over `group_ids`.

Letters used in the shape comments:
    M   prompts in the step (groups)
    B_i rollouts of prompt i;  N = sum_i B_i rollouts in the batch
    P   prompt length after left padding
    T   completion length after right padding
    L   = P + T, the length of one row of input_ids
    V   vocabulary size

Defaults are the CoBA paper's (App. C): no KL (beta = 0, so no reference model is loaded),
eps_low = 0.2, eps_high = 0.28, token-mean aggregation, std-normalised advantages.

Departures and choices, each with its source:
  (1) Std with Bessel's correction (torch.std), as verl and the paper's released code; the
      population std (numpy's np.std, used by GRPO-Zero, nano-aha-moment) is `unbiased=False`.
  (2) A group of size 1 gets advantage 0 (it has no baseline to compare with). verl instead uses
      mean 0, std 1 for such a group, i.e. A = r. The paper's B_low = 2 never makes one.
  (3) Groups whose rewards are all equal also get exactly 0, and both kinds are counted as
      "zero-signal groups": the prompts whose rollouts bought no gradient, the waste that
      CoBA's allocation (eq. 8 vanishes at p = 0 and p = 1) is meant to reduce.
  (4) `normalizer` lets gradient accumulation over micro-batches reproduce the big-batch loss
      exactly (see aggregate_loss).
  (5) Entropy is a logged metric only, computed without gradient.
  (6) Off by default: truncated_importance_weights (TIS) reweights each token's surrogate when
      the rollouts came from another engine (vLLM) than the one that computes pi_old; with vLLM
      rollouts the gap between the two is logged (sampler_gap, sampler_gap_means).

Test: tests/test_grpo.py
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from engines import dist

LOSS_TYPES = ("dapo", "grpo", "dr_grpo")


# ----------------------------------------------------------------------------------------------
# 1. Group-relative advantages on groups of unequal size (DeepSeekMath §4.1.2, outcome supervision)
# ----------------------------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_std: bool = True,
                     unbiased: bool = True, eps: float = 1e-6) -> tuple[torch.Tensor, dict]:
    """A_j = (r_j - mean of r in j's group) / (std of r in j's group + eps), one value per rollout.

    rewards:   r_j, shape (N,), one scalar reward per rollout (binary in CoBA, any float works).
    group_ids: shape (N,), the prompt of each rollout; any integer labels, in any order, groups
               of any size (B_i). Rollouts with equal ids form one group.
    scale_std: divide by the group std (DeepSeekMath); False = Dr. GRPO's mean-only advantage.
    unbiased:  Bessel's correction, std = sqrt(sum (r - mean)^2 / (B_i - 1)) (torch.std, verl,
               the released code); False divides by B_i (np.std). Rewards [0, 1]: +/-0.707 vs +/-1.
    eps:       added to the std so that a tiny spread cannot blow the advantage up.

    Returns (advantages (N,), stats) with stats = {"num_groups", "zero_signal_groups",
    "zero_signal_rollouts"} (ints): groups of size 1 or with identical rewards, whose advantages
    are set to exactly 0, and the number of rollouts in them.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be 1-D of the same length (N,), got "
                         f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError("group_ids must be an integer tensor (prompt index of each rollout)")
    r = rewards if rewards.dtype.is_floating_point else rewards.float()  # (N,)
    # Relabel the prompt ids as 0..M-1, so any labels work and bincount has no empty bins.
    _, g = torch.unique(group_ids, return_inverse=True)  # (N,) group of each rollout
    M = int(g.max()) + 1 if len(g) else 0
    size = torch.bincount(g, minlength=M).to(r.dtype)  # (M,) B_i
    mean = torch.zeros(M, dtype=r.dtype, device=r.device).index_add_(0, g, r) / size  # (M,)
    deviation = r - mean[g]  # (N,) r_j - mean of its group
    squares = torch.zeros(M, dtype=r.dtype, device=r.device).index_add_(0, g, deviation ** 2)  # (M,)
    dof = (size - 1).clamp(min=1) if unbiased else size  # size-1 groups are zeroed below anyway
    std = (squares / dof).sqrt()  # (M,)
    # Zero signal: nothing to compare (B_i = 1) or nothing differs (all rewards equal). Tested
    # with max == min, not std == 0, because the float mean of equal non-binary rewards can be
    # off by one ulp and leave a spurious tiny deviation.
    r_max = torch.full((M,), float("-inf"), dtype=r.dtype, device=r.device).scatter_reduce(0, g, r, "amax")
    r_min = torch.full((M,), float("inf"), dtype=r.dtype, device=r.device).scatter_reduce(0, g, r, "amin")
    zero_signal = (size == 1) | (r_max == r_min)  # (M,)
    advantages = deviation / (std[g] + eps) if scale_std else deviation  # (N,)
    advantages = torch.where(zero_signal[g], torch.zeros_like(advantages), advantages)  # (N,)
    stats = {"num_groups": M, "zero_signal_groups": int(zero_signal.sum()),
             "zero_signal_rollouts": int(size[zero_signal].sum())}
    return advantages, stats


# ----------------------------------------------------------------------------------------------
# 2. Per-token log-probabilities of the completions under a causal LM
# ----------------------------------------------------------------------------------------------
def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    micro_batch_size: int | None = None, temperature: float = 1.0,
                    with_entropy: bool = False):
    """log pi(o_t | q, o_<t) for the last `logits_to_keep` (= T) tokens of every row.

    input_ids, attention_mask: (N, L), each row a left-padded prompt followed by a right-padded
    completion, so the completion fills the last T positions. attention_mask is 0 on padding.
    micro_batch_size: rows per forward pass (memory); None = all N at once. The result does not
    depend on it.
    temperature: the sampling temperature of the rollouts. Rollouts were drawn from
    softmax(logits / temperature), so that is the distribution whose ratio and KL we need; without
    the division pi_theta / pi_old would differ from 1 even before any update (TRL does the same).

    Returns logps (N, T), or (logps, entropy) both (N, T) with `with_entropy`. Entropy is a metric
    and carries no gradient. Positions after a completion's end (padding) get values too; the
    completion mask of the loss drops them. Works with gradients (the policy) and under
    torch.no_grad() (the rollout policy's and the reference's log-probs).
    """
    N, L = input_ids.shape
    T = int(logits_to_keep)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids {(N, L)}")
    if not 1 <= T < L:
        raise ValueError(f"logits_to_keep = T must be in [1, L - 1] = [1, {L - 1}] (the completion "
                         f"length; at least one prompt token must precede it), got {T}")
    step = N if micro_batch_size is None else int(micro_batch_size)
    if step < 1:
        raise ValueError(f"micro_batch_size must be a positive number of rows or None, got {micro_batch_size}")
    parts = [_logps_rows(model, input_ids[s:s + step], attention_mask[s:s + step], T, temperature, with_entropy)
             for s in range(0, N, step)]
    logps = torch.cat([p[0] for p in parts])  # (N, T)
    return (logps, torch.cat([p[1] for p in parts])) if with_entropy else logps


def per_token_logps_shared_prompt(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                  logits_to_keep: int, micro_batch_size: int | None = None,
                                  temperature: float = 1.0, with_entropy: bool = False):
    """per_token_logps, with each distinct prompt of a micro-batch run once, not once per rollout.

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
    Same arguments, same result as per_token_logps up to float rounding: the same sums are formed
    in a different grouping (a batch of u rows instead of n, the attention over cache + new
    columns), which moves fp32 results by ~1e-7 relative, bf16 autocast ones by ~1e-2
    (tests/test_speed.py states the tolerances). The result does not depend on micro_batch_size,
    but the saving does: only rows of one prompt inside one micro-batch share its forward, so
    callers group a mini-batch's rows by prompt before splitting it (train.policy_update).
    Needs a transformers causal LM (past_key_values, position_ids); other models, and a batch
    without repeated prompts, take per_token_logps' plain path. Gradient checkpointing turns the
    cache off inside transformers' layers, so train.py refuses that combination.
    """
    N, L = input_ids.shape
    T = int(logits_to_keep)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids {(N, L)}")
    if not 1 <= T < L:
        raise ValueError(f"logits_to_keep = T must be in [1, L - 1] = [1, {L - 1}], got {T}")
    if not {"past_key_values", "position_ids"} <= _forward_params(model):
        return per_token_logps(model, input_ids, attention_mask, T, micro_batch_size, temperature, with_entropy)
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
        return _logps_rows(model, ids, mask, T, temperature, with_entropy)
    p_ids, p_mask = distinct[:, :P], distinct[:, P:].to(mask.dtype)  # (u, P) each
    # Positions count real tokens only, exactly as in _logps_rows (and as generation numbered them).
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (n, L)
    p_positions = (p_mask.long().cumsum(-1) - 1).clamp(min=0)  # (u, P)
    # 1. each distinct prompt once, with gradient; its last logit predicts completion token 0.
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_positions, use_cache=True,
                logits_to_keep=1)
    first = out.logits[:, -1:, :][row_prompt]  # (n, 1, V)
    if T == 1:
        return _logps_from_logits(first, ids[:, -T:], temperature, with_entropy)
    # 2. each row gets its prompt's keys and values, layer by layer (index_select, differentiable).
    cache = out.past_key_values
    cache.reorder_cache(row_prompt)  # (u, heads, P, d) -> (n, heads, P, d) per layer
    # 3. the completion columns but the last (whose logit predicts past the row) on top of the
    # cache; the mask covers cache + new columns, as the plain forward's would.
    rest = model(input_ids=ids[:, P:L - 1], attention_mask=mask[:, :L - 1], position_ids=positions[:, P:L - 1],
                 past_key_values=cache, use_cache=True).logits  # (n, T-1, V)
    return _logps_from_logits(torch.cat([first, rest], 1), ids[:, -T:], temperature, with_entropy)


def _logps_rows(model, ids: torch.Tensor, mask: torch.Tensor, T: int, temperature: float, with_entropy: bool):
    """One micro-batch of per_token_logps: ids, mask (n, L) -> logps (n, T), entropy (n, T) or None."""
    accepted = _forward_params(model)
    kwargs = {}
    if "position_ids" in accepted:
        # Positions count real tokens only, exactly as HF generate (and vLLM) numbered them while
        # sampling, so a left-padded row is scored at the positions it was generated at.
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (n, L)
    if "logits_to_keep" in accepted:
        # Project only the last T + 1 hidden states onto the vocabulary: (n, T+1, V), not (n, L, V).
        kwargs["logits_to_keep"] = T + 1
    logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits  # (n, T+1, V) or (n, L, V)
    # The logit at position j predicts token j + 1. The completion's tokens sit at L-T .. L-1, so
    # their predictions come from positions L-T-1 .. L-2; the very last logit predicts a token
    # after the row, which was never sampled, and is dropped.
    return _logps_from_logits(logits[:, -(T + 1):-1, :], ids[:, -T:], temperature, with_entropy)


def _logps_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """logits (n, T, V) predicting targets (n, T) -> logps (n, T), entropy (n, T) or None."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # a log-softmax over ~1e5 entries loses digits in 16-bit floats
    logits = logits / temperature  # (n, T, V)
    # log_softmax at the target only: logit - logsumexp, without a second (n, T, V) tensor.
    log_norm = torch.logsumexp(logits, dim=-1)  # (n, T)
    logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # (n, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # (n, T, V)
            entropy = log_norm - (probs * logits).sum(-1)  # (n, T)  H = -sum p log p
    return logps, entropy


def _forward_params(model) -> set[str]:
    """Keyword names model.forward accepts (transformers causal LMs take logits_to_keep, position_ids)."""
    return set(inspect.signature(model.forward).parameters)


# ----------------------------------------------------------------------------------------------
# 3. The clipped surrogate with importance ratio, clip-higher, and k3 KL (DeepSeekMath eqs. 3-4)
# ----------------------------------------------------------------------------------------------
def clipped_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                        completion_mask: torch.Tensor, epsilon_low: float = 0.2, epsilon_high: float = 0.28,
                        ref_logps: torch.Tensor | None = None, beta: float = 0.0, loss_type: str = "dapo",
                        max_completion_length: int | None = None, normalizer: float | None = None,
                        entropy: torch.Tensor | None = None,
                        token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Per token: -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * KL_k3,
    then aggregated over tokens by `loss_type` (see aggregate_loss).

    logps:      log pi_theta(o_t), (N, T), with gradient (from per_token_logps).
    old_logps:  log pi_old(o_t) of the rollout policy, (N, T), no gradient. In the first
                optimizer step of a batch pi_theta = pi_old, so pass logps.detach(): ratio = 1.
    advantages: (N,), one per rollout (group_advantages), shared by all its tokens.
    completion_mask: (N, T), 1 on completion tokens up to and including EOS, 0 on padding.
    epsilon_low, epsilon_high: clip range [1 - eps_low, 1 + eps_high]. DAPO raises only the upper
                end (0.28 > 0.2) so that unlikely tokens with A > 0 can grow, which keeps the
                policy from collapsing its entropy.
    ref_logps, beta: log pi_ref of a frozen reference model, (N, T), and its coefficient. beta = 0
                (the paper's setting) needs no reference; ref_logps alone only logs the KL.
    loss_type, max_completion_length, normalizer: passed to aggregate_loss.
    entropy:    (N, T) from per_token_logps(with_entropy=True), only to log its mean.
    token_weights: optional (N, T), no gradient, multiplies each token's clipped surrogate (not the
                KL term), e.g. truncated_importance_weights for vLLM rollouts (TRL does the same).

    Returns (loss scalar, metrics), metrics = python floats, means over completion tokens:
    ratio_mean; clip_frac (share of tokens where the min picks the clipped term and it is
    strictly smaller, i.e. the token gives no gradient); kl (k3 mean, 0.0 without ref_logps);
    num_tokens; and entropy if given.
    """
    if logps.dim() != 2 or old_logps.shape != logps.shape or completion_mask.shape != logps.shape:
        raise ValueError(f"logps, old_logps and completion_mask must all be (N, T); got {tuple(logps.shape)}, "
                         f"{tuple(old_logps.shape)}, {tuple(completion_mask.shape)}")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logps.shape[0]},), one per rollout, got {tuple(advantages.shape)}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError(f"beta = {beta} needs ref_logps (log-probs under the frozen reference model); "
                         f"pass them or set beta = 0")
    m = completion_mask.bool()  # (N, T)
    zero = torch.zeros_like(logps)
    # Masked positions get log-ratio 0 (ratio 1) before exp, so whatever sits there (even inf or
    # NaN from padding) reaches neither the loss nor the gradient.
    log_ratio = torch.where(m, logps - old_logps, zero)  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T) pi_theta / pi_old
    A = advantages.to(logps.dtype).unsqueeze(1)  # (N, 1), broadcast over the tokens
    unclipped = ratio * A  # (N, T)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * A  # (N, T)
    per_token_loss = -torch.min(unclipped, clipped)  # (N, T) pessimistic bound, as in PPO
    if token_weights is not None:
        if token_weights.shape != logps.shape:
            raise ValueError(f"token_weights must be (N, T) = {tuple(logps.shape)}, got {tuple(token_weights.shape)}")
        per_token_loss = per_token_loss * token_weights.detach().to(logps.dtype)  # (N, T)
    kl = None
    if ref_logps is not None:
        # k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020; DeepSeekMath eq. 4): with
        # d = log pi_ref - log pi_theta, e^d - d - 1 >= 0, unbiased, and lower-variance than -d.
        d = torch.where(m, ref_logps - logps, zero)  # (N, T)
        kl = torch.exp(d) - d - 1  # (N, T)
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * kl  # (N, T)
    loss = aggregate_loss(per_token_loss, completion_mask, loss_type, max_completion_length, normalizer)

    # Clipped branch active: ratio above 1 + eps_high with A > 0, or below 1 - eps_low with A < 0.
    is_clipped = ((ratio > 1 + epsilon_high) & (A > 0)) | ((ratio < 1 - epsilon_low) & (A < 0))  # (N, T)
    with torch.no_grad():
        metrics = {"ratio_mean": _masked_mean(ratio, m),
                   "clip_frac": _masked_mean(is_clipped.to(logps.dtype), m),
                   "kl": 0.0 if kl is None else _masked_mean(kl, m),
                   "num_tokens": float(m.sum())}
        if entropy is not None:
            metrics["entropy"] = _masked_mean(entropy, m)
    return loss, metrics


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


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    """Mean of x over the True positions of m, as a python float; 0.0 when there are none."""
    count = int(m.sum())
    return float(torch.where(m, x, torch.zeros_like(x)).sum()) / count if count else 0.0


# ----------------------------------------------------------------------------------------------
# 4. Loss aggregation: how the per-token terms of a batch become one number
# ----------------------------------------------------------------------------------------------
def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                   max_completion_length: int | None = None, normalizer: float | None = None) -> torch.Tensor:
    """Sum the masked per-token loss (N, T) into a scalar; the modes differ only in the weights.

    With K = number of mask tokens in the batch, |o_i| = tokens of row i:
      "dapo"    sum_i sum_t l_it / K              every token weighs the same, so long
                                                   completions are not down-weighted (DAPO §3.3)
      "grpo"    (1/N) sum_i (1/|o_i|) sum_t l_it  DeepSeekMath eq. 3; a token of a short
                                                   completion weighs more (length bias)
      "dr_grpo" sum_i sum_t l_it / (N * max_completion_length)
                                                   a constant divisor (Dr. GRPO), no length bias
    An all-padding row counts as a sequence with zero loss.

    normalizer: replaces K ("dapo") or N ("grpo", "dr_grpo"; dr_grpo still multiplies by
    max_completion_length). To split a batch into micro-batches and accumulate gradients, pass
    the *whole batch's* K (dapo) or N (grpo, dr_grpo) to every micro-batch: the micro-batch
    losses then sum to exactly the whole-batch loss, and so do their gradients. Without it, each
    micro-batch would be normalised by its own count and the sum would weigh them wrongly.
    Counts are clamped to at least 1, so a batch with no tokens gives 0, not NaN.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; accepted: {', '.join(LOSS_TYPES)}")
    if per_token_loss.shape != mask.shape or per_token_loss.dim() != 2:
        raise ValueError(f"per_token_loss and mask must both be (N, T), got {tuple(per_token_loss.shape)} "
                         f"and {tuple(mask.shape)}")
    if normalizer is not None and normalizer < 0:
        raise ValueError(f"normalizer must be a count >= 0 (whole-batch tokens or sequences), got {normalizer}")
    m = mask.bool()
    masked = torch.where(m, per_token_loss, torch.zeros_like(per_token_loss))  # (N, T)
    N = per_token_loss.shape[0]
    if loss_type == "dapo":
        K = float(m.sum()) if normalizer is None else float(normalizer)
        return masked.sum() / max(K, 1.0)
    n_seq = float(N) if normalizer is None else float(normalizer)
    if loss_type == "grpo":
        per_sequence = masked.sum(-1) / m.sum(-1).clamp(min=1)  # (N,) mean over each row's tokens
        return per_sequence.sum() / max(n_seq, 1.0)
    if max_completion_length is None or max_completion_length < 1:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (the generation limit, "
                         f"a positive int), got {max_completion_length}")
    return masked.sum() / (max(n_seq, 1.0) * max_completion_length)


# ----------------------------------------------------------------------------------------------
# 5. App. C's update: the clipped surrogate over mini-batches, one optimizer step each
# ----------------------------------------------------------------------------------------------
def policy_update(model, optimizer, scheduler, batch: dict, args, ref_model=None, gen_seed: int = 0,
                  autocast=contextlib.nullcontext) -> dict:
    """GRPO on one step's rollouts (App. C): `num_mini_batches` optimizer steps over a shuffled split of
    the N rows, each accumulated over micro-batches of `micro_batch_size` rows. Returns metrics.
    pi_old: see frozen_logps. --shared-prompt-forward (a speed-up, the same sums up to float rounding:
    tests/test_speed.py) runs each distinct prompt once per micro-batch, a mini-batch's rows sorted by
    prompt so that a prompt's rows share micro-batches (per_token_logps_shared_prompt).
    Under torchrun this rank holds n of the N rows (batch["rows"]); mini-batches are drawn over all N
    and normalised by their global size, so the gradients summed over ranks are one process's."""
    ids, attn, cmask, adv = batch["input_ids"], batch["attention_mask"], batch["completion_mask"], batch["advantages"]
    rows_global = batch.get("rows", torch.arange(len(cmask)))  # (n,) this rank's rows among the N
    lengths = batch.get("lengths", cmask.sum(1))  # (N,) every row's completion length
    sampler_logps = batch.get("sampler_logps")  # (N, T) vLLM's log-probs of the sampled tokens; None on HF
    cap = getattr(args, "vllm_importance_sampling_cap", None)  # truncated IS (off: None)
    N, T = cmask.shape
    shared = getattr(args, "shared_prompt_forward", False)
    logps_fn = per_token_logps_shared_prompt if shared else per_token_logps

    def mb(rows, m, **kw):  # forward only under autocast (bf16); backward and optimizer in fp32
        with autocast():
            return logps_fn(m, ids[rows], attn[rows], T, temperature=args.temperature, **kw)

    micro = args.micro_batch_size
    own_first = batch.get("old_logps") is not None  # the first mini-batch's own detached forward is pi_old
    old_logps, ref_logps = frozen_logps(mb, model, ref_model, N, micro, batch.get("old_logps"),
                                        need_old=args.num_mini_batches > 1)  # (N, T) each, or None
    N_all = len(lengths)
    perm = torch.randperm(N_all, generator=torch.Generator().manual_seed(gen_seed))
    sharded = dist.is_sharded(model)  # --fsdp (walks the modules: once per update, not per mini-batch)
    sums: dict[str, float] = {}
    gap = [0.0, 0.0, 0.0]  # sum |log pi_trainer - log pi_sampler|, completion tokens, sum of IS weights
    for k, global_chunk in enumerate(torch.chunk(perm, min(args.num_mini_batches, N_all))):
        # the whole mini-batch's normaliser (all ranks): accumulated micro-batches give one big batch's gradient
        normalizer = float(lengths[global_chunk].sum()) if args.loss_type == "dapo" else float(len(global_chunk))
        for rows, pad in dist.micro_batches(global_chunk, rows_global, N_all, micro, sharded, by_prompt=shared):
            logps, entropy = mb(rows, model, with_entropy=True)  # (n, T) each
            if pad:  # --fsdp: a micro-batch of weight 0, so that every rank runs as many (engines/dist.py rule 2)
                (logps.sum() * 0.0).backward()
                continue
            old = logps.detach() if old_logps is None or (own_first and k == 0) else old_logps[rows]
            is_weights = None
            if sampler_logps is not None:  # vLLM: the trainer's log-probs at rollout time vs the sampler's
                is_weights, gap_sums = sampler_gap(old, sampler_logps[rows], cmask[rows], cap)  # (n, T) or None
                gap = [g + s for g, s in zip(gap, gap_sums)]
            loss, metrics = clipped_policy_loss(
                logps, old, adv[rows], cmask[rows], epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                ref_logps=None if ref_logps is None else ref_logps[rows], beta=args.beta,
                loss_type=args.loss_type, max_completion_length=args.max_completion_length,
                normalizer=normalizer, entropy=entropy, token_weights=is_weights)
            loss.backward()
            # Token means (ratio, clip, kl, entropy) weighted by this micro-batch's share of the step's tokens,
            # all ranks' (lengths): their sum is the token mean over the whole step however its rows are
            # split into micro-batches and ranks. (Weighted by rows, the split changed them: issue 41.)
            w = float(cmask[rows].sum()) / max(float(lengths.sum()), 1.0)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + (value if key == "num_tokens" else w * value)
            sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) / args.num_mini_batches
        if not sharded:  # --fsdp: the reduce-scatter in each backward summed them already
            dist.all_reduce_grads(model)  # sum over ranks (no-op in one process)
        sums["grad_norm"] = dist.grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    sums = dist.all_reduce_sums(sums, keep=("grad_norm",))  # each rank's share of the batch's means
    return {**sums, **sampler_gap_means(*dist.all_reduce_sums(dict(enumerate(gap))).values(), cap=cap)}


def frozen_logps(mb, model, ref_model, N: int, micro: int, old_logps=None, need_old: bool = True) -> tuple:
    """(pi_old's, pi_ref's) log-probs of the N rows before the update, (N, T) each or None, from no-grad
    forwards in micro-batches (mb(rows, model) is one). pi_ref is the frozen reference model's (--beta > 0).
    pi_old is the rollout policy's, needed once the first optimizer step has moved the policy (need_old:
    more than one mini-batch). A speed-up, the plain computation up to float rounding (tests/test_speed.py):
    old_logps (HF rollouts with --sampler-logps) are generation's own log pi(o_t), under the same weights,
    and replace this forward; and the first mini-batch needs none at all: the policy has not moved yet,
    so its own detached forward is pi_old (ratio exactly 1, as in the one-mini-batch case)."""
    rows_all, ref_logps = torch.arange(N), None
    model.eval()  # pi_old and pi_ref without dropout (--lora-dropout; a full model has none)
    with torch.no_grad(), dist.gathered(model):  # --fsdp: ranks' forward counts differ here (rule 1)
        # (N = 0: a torchrun rank that owns no group this step, with fewer prompts than ranks: nothing
        # to compute; it still joins every collective of the update with zero gradients.)
        if need_old and old_logps is None and N:
            old_logps = torch.cat([mb(rows_all[s:s + micro], model) for s in range(0, N, micro)])  # (N, T)
        if ref_model is not None and N:
            ref_logps = torch.cat([mb(rows_all[s:s + micro], ref_model) for s in range(0, N, micro)])  # (N, T)
    model.train()
    return old_logps, ref_logps

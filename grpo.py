"""GRPO on ragged groups (CoBA-RL §2.1, App. C): from (prompt, completions, rewards) to one update.

One small function per equation, in the order of a step (DeepSeekMath, arXiv 2402.03300, §4.1):

    1. group_advantages     A_j = (r_j - mean_group(r)) / std_group(r)            DeepSeekMath §4.1.2
    2. per_token_logps      log pi_theta(o_t | q, o_<t) of every completion token
    3. clipped_policy_loss  -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A) + beta k3 KL
                            DeepSeekMath eqs. 3-4; eps_high > eps_low: DAPO's clip-higher (§3.1)
    4. aggregate_loss       "dapo" token mean (DAPO §3.3, the paper's) | "grpo" (eq. 3) | "dr_grpo"
    5. policy_update        App. C: the rows in shuffled mini-batches, one optimizer step each

CoBA-RL gives prompt i its own number of rollouts B_i, so the groups are ragged: every group
statistic is a scatter over `group_ids`, never a reshape into (M, G). Defaults are App. C's:
beta = 0 (no reference model), eps_low 0.2, eps_high 0.28, token mean, std-normalised advantages.

Shapes: M prompts (groups), B_i rollouts of prompt i, N = sum_i B_i rows; a row is a left-padded
prompt of P tokens then a right-padded completion of T tokens (L = P + T); V vocabulary.

The update train.py runs is engines/update.py:policy_update, the same update plus micro-batches,
torchrun/FSDP, vLLM's sampler correction (engines/sampler_correction.py) and the shared-prompt
forward (speedups/shared_prompt.py). Choices and their sources: docs/method-sources.md §5.
Tests: tests/test_grpo.py.
"""
from __future__ import annotations

import inspect

import torch

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
                KL term): vLLM's truncated importance weights (engines/sampler_correction.py), as TRL.

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
def policy_update(model, optimizer, scheduler, batch: dict, args, ref_model=None, gen_seed: int = 0) -> dict:
    """GRPO on one step's rollouts (App. C), plainly, in one process: the N rows shuffled into
    `args.num_mini_batches` mini-batches, one clipped-surrogate optimizer step on each.
    engines/update.py:policy_update is what train.py runs: the same update, plus micro-batches across
    torchrun ranks and FSDP, vLLM's sampler correction and the shared-prompt speed-up.

    batch: input_ids, attention_mask (N, L), completion_mask (N, T), advantages (N,).
    args: num_mini_batches, temperature, epsilon, epsilon_high, beta, loss_type,
    max_completion_length, max_grad_norm. Returns metrics: loss (mean over mini-batches), grad_norm
    (the last step's), and the token means of clipped_policy_loss's metrics over the whole batch."""
    ids, attn, cmask, adv = batch["input_ids"], batch["attention_mask"], batch["completion_mask"], batch["advantages"]
    N, T = cmask.shape

    def logps_of(m, rows, **kw):  # log-probs of the given rows' completions under model m
        return per_token_logps(m, ids[rows], attn[rows], T, temperature=args.temperature, **kw)

    # pi_old (the policy that sampled the rollouts) and pi_ref, before any step: no gradient, no dropout.
    model.eval()
    with torch.no_grad():
        old_logps = logps_of(model, torch.arange(N))  # (N, T)
        ref_logps = None if ref_model is None else logps_of(ref_model, torch.arange(N))  # (N, T)
    model.train()
    out = {"loss": 0.0}
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(gen_seed))  # (N,) the shuffle
    for rows in torch.chunk(perm, min(args.num_mini_batches, N)):  # (n,) each, about N / num_mini_batches
        logps, entropy = logps_of(model, rows, with_entropy=True)  # (n, T) each, logps with gradient
        loss, metrics = clipped_policy_loss(
            logps, old_logps[rows], adv[rows], cmask[rows], epsilon_low=args.epsilon,
            epsilon_high=args.epsilon_high, ref_logps=None if ref_logps is None else ref_logps[rows],
            beta=args.beta, loss_type=args.loss_type, max_completion_length=args.max_completion_length,
            entropy=entropy)
        loss.backward()
        out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        out["loss"] += float(loss.detach()) / args.num_mini_batches
        share = float(cmask[rows].sum()) / max(float(cmask.sum()), 1.0)  # this mini-batch's share of tokens
        for key, value in metrics.items():  # token means over the batch (num_tokens: a count, summed)
            out[key] = out.get(key, 0.0) + (value if key == "num_tokens" else share * value)
    return out

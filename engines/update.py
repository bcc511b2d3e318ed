"""The policy update train.py runs: grpo.policy_update (App. C) at scale, the same update.

grpo.py holds App. C's update plainly, for one process (grpo.policy_update; tests/test_grpo.py
checks that both give the same weights). This version adds, without changing what is computed:
  - micro-batches: each mini-batch's gradient accumulated over micro-batches of
    --micro-batch-size rows, each normalised by the whole mini-batch's count (aggregate_loss's
    normalizer), so the sum is the one big-batch gradient;
  - torchrun and FSDP2: this rank's rows of each mini-batch (dist.micro_batches), gradients and
    metric sums added over ranks, zero-weight micro-batches so every FSDP rank runs as many;
  - vLLM's sampler correction (engines/sampler_correction.py): the logged log-prob gap and,
    with a cap, truncated importance weights on each token's surrogate;
  - speed-ups: bf16 autocast on the forward, --shared-prompt-forward
    (speedups/shared_prompt.py), and pi_old from generation's own log-probs (--sampler-logps).
Shapes: N rows (rollouts) in the step, n of them on this rank, T completion tokens.
Tests: tests/test_step.py (the golden step), tests/test_speed.py, tests/test_dist.py.
"""
from __future__ import annotations

import contextlib

import torch

import grpo
from engines import dist
from engines.sampler_correction import sampler_gap, sampler_gap_means
from speedups import shared_prompt


def policy_update(model, optimizer, scheduler, batch: dict, args, ref_model=None, gen_seed: int = 0,
                  autocast=contextlib.nullcontext) -> dict:
    """GRPO on one step's rollouts (App. C): `num_mini_batches` optimizer steps over a shuffled split of
    the N rows, each accumulated over micro-batches of `micro_batch_size` rows. Returns metrics.
    pi_old: see frozen_logps. --shared-prompt-forward (a speed-up, the same sums up to float rounding:
    tests/test_speed.py) runs each distinct prompt once per micro-batch, a mini-batch's rows sorted by
    prompt so that a prompt's rows share micro-batches (shared_prompt.per_token_logps_shared_prompt).
    Under torchrun this rank holds n of the N rows (batch["rows"]); mini-batches are drawn over all N
    and normalised by their global size, so the gradients summed over ranks are one process's."""
    ids, attn, cmask, adv = batch["input_ids"], batch["attention_mask"], batch["completion_mask"], batch["advantages"]
    rows_global = batch.get("rows", torch.arange(len(cmask)))  # (n,) this rank's rows among the N
    lengths = batch.get("lengths", cmask.sum(1))  # (N,) every row's completion length
    sampler_logps = batch.get("sampler_logps")  # (N, T) vLLM's log-probs of the sampled tokens; None on HF
    cap = getattr(args, "vllm_importance_sampling_cap", None)  # truncated IS (off: None)
    N, T = cmask.shape
    shared = getattr(args, "shared_prompt_forward", False)
    logps_fn = shared_prompt.per_token_logps_shared_prompt if shared else grpo.per_token_logps

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
            loss, metrics = grpo.clipped_policy_loss(
                logps, old, adv[rows], cmask[rows], epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                ref_logps=None if ref_logps is None else ref_logps[rows], beta=args.beta,
                loss_type=args.loss_type, max_completion_length=args.max_completion_length,
                normalizer=normalizer, entropy=entropy, token_weights=is_weights)
            loss.backward()
            # Token means (ratio, clip, kl, entropy) weighted by this micro-batch's share of the step's tokens,
            # all ranks' (lengths): their sum is the token mean over the whole step however its rows are
            # split into micro-batches and ranks (weighted by rows, the split would change them).
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

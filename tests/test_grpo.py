"""grpo.py against numbers a student can redo on paper, and against a hand-written reference on a
tiny Qwen2. Run: python -m pytest -q tests/test_grpo.py  (a few seconds on one CPU core)
"""
import copy
import math
import types

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import grpo
from engines import sampler_correction

PAD = 0


# ----------------------------------------------------------------------------------------------
# 1. Advantages on ragged groups
# ----------------------------------------------------------------------------------------------
# Groups of sizes 1, 2, 3, 5 (and a size-4 group that all got right), interleaved on purpose:
# nothing may assume equal sizes or contiguous rows.
#   id 7, size 1: [1]              -> 0 (no baseline)                          zero signal
#   id 3, size 2: [0, 1]           mean 1/2, sum sq 1/2: unbiased std sqrt(1/2) = 0.7071 -> -/+0.7071;
#                                  population std 1/2 -> -/+1
#   id 0, size 3: [0, 0, 1]        mean 1/3, sum sq 1/9+1/9+4/9 = 2/3: unbiased std sqrt(1/3) = 0.5774
#                                  -> -0.5774, -0.5774, +1.1547; population std sqrt(2/9) -> -0.7071, +1.4142
#   id 5, size 5: [1, 0, 0, 0, 1]  mean 0.4, sum sq 2*0.36 + 3*0.16 = 1.2: unbiased std sqrt(0.3) = 0.5477
#                                  -> +1.0954, -0.7303; population std sqrt(0.24) -> +1.2247, -0.8165
#   id 9, size 4: [1, 1, 1, 1]     -> 0                                        zero signal
IDS = [5, 3, 0, 7, 5, 9, 0, 5, 3, 9, 0, 5, 9, 5, 9]
REW = [1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1]


def expected_advantages(unbiased):
    s = math.sqrt
    a3 = 1 / s(1 / 2) / 2 if unbiased else 1.0  # 0.5 / std
    std0 = s(1 / 3) if unbiased else s(2 / 9)
    a0_neg, a0_pos = (-1 / 3) / std0, (2 / 3) / std0
    std5 = s(0.3) if unbiased else s(0.24)
    a5_pos, a5_neg = 0.6 / std5, -0.4 / std5
    by_row = {  # (group id, reward) -> advantage
        (7, 1): 0.0, (3, 0): -a3, (3, 1): a3, (0, 0): a0_neg, (0, 1): a0_pos,
        (5, 1): a5_pos, (5, 0): a5_neg, (9, 1): 0.0}
    return torch.tensor([by_row[(i, r)] for i, r in zip(IDS, REW)], dtype=torch.float64)


@pytest.mark.parametrize("unbiased", [True, False])
def test_group_advantages_hand_computed_ragged_groups(unbiased):
    adv, stats = grpo.group_advantages(torch.tensor(REW, dtype=torch.float64), torch.tensor(IDS),
                                       unbiased=unbiased, eps=0.0)
    torch.testing.assert_close(adv, expected_advantages(unbiased), rtol=1e-12, atol=1e-12)
    # rewards [0, 1]: +/-0.7071 with Bessel's correction (torch.std, verl), +/-1 with np.std
    assert abs(adv[1].item() - (-0.70710678 if unbiased else -1.0)) < 1e-8
    # zero-signal: the size-1 group (1 rollout) and the all-correct size-4 group (4 rollouts)
    assert stats == {"num_groups": 5, "zero_signal_groups": 2, "zero_signal_rollouts": 5}
    # each group's advantages sum to 0 (the group mean is the baseline)
    for g in set(IDS):
        assert abs(adv[torch.tensor(IDS) == g].sum().item()) < 1e-12


def test_group_advantages_eps_std_off_and_float32():
    rewards, ids = torch.tensor(REW, dtype=torch.float32), torch.tensor(IDS)
    adv, _ = grpo.group_advantages(rewards, ids)  # default eps = 1e-6 changes only the 6th digit
    torch.testing.assert_close(adv, expected_advantages(True).float(), rtol=1e-5, atol=1e-5)
    # Dr. GRPO: r - mean only. Group 3: -/+0.5; group 0: -1/3, 2/3; group 5: 0.6, -0.4; others 0.
    adv, stats = grpo.group_advantages(rewards, ids, scale_std=False)
    assert adv[[1, 8, 2, 10, 0, 4, 3, 5]].tolist() == pytest.approx([-0.5, 0.5, -1 / 3, 2 / 3, 0.6, -0.4, 0, 0])
    assert stats["zero_signal_groups"] == 2


def test_group_advantages_equal_non_binary_rewards_are_exactly_zero():
    # Three 0.1s: in float64 their mean is 0.1 + 1.4e-17, so r - mean is not 0 and neither is the
    # computed std; the group still carries no signal and must get exactly 0.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 0.5], dtype=torch.float64)
    assert (rewards[:3] - rewards[:3].mean()).abs().max() > 0
    adv, stats = grpo.group_advantages(rewards, torch.tensor([2, 2, 2, 4, 4]))
    assert adv[:3].tolist() == [0.0, 0.0, 0.0] and stats["zero_signal_groups"] == 1  # exact: the code writes 0 for a group without signal (what this test checks)
    assert adv[3].item() == pytest.approx(-0.7071, abs=1e-4)


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="same length"):
        grpo.group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        grpo.group_advantages(torch.zeros(3), torch.zeros(3))


# ----------------------------------------------------------------------------------------------
# 2. Aggregation and the clipped surrogate on hand-computed tensors
# ----------------------------------------------------------------------------------------------
# Two rows: 3 tokens and 1 token; the masked slots hold junk (100, nan) that must never show up.
NAN = float("nan")
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, NAN, 100.0, NAN]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("loss_type, expected", [
    ("dapo", (1 + 2 + 3 + 4) / 4),           # token mean over the batch: 10 / 4 = 2.5
    ("grpo", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # (2 + 4) / 2 = 3.0
    ("dr_grpo", (1 + 2 + 3 + 4) / (2 * 8)),  # 10 / (N = 2 * max_completion_length = 8) = 0.625
])
def test_aggregate_loss_hand_computed(loss_type, expected):
    assert grpo.aggregate_loss(LOSS, MASK, loss_type, max_completion_length=8).item() == pytest.approx(expected)


def test_aggregate_loss_errors():
    with pytest.raises(ValueError, match="dapo, grpo, dr_grpo"):
        grpo.aggregate_loss(LOSS, MASK, "token-mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo.aggregate_loss(LOSS, MASK, "dr_grpo")


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_normalizer_makes_micro_batches_sum_to_full_batch(loss_type):
    g = torch.Generator().manual_seed(0)
    per_token = torch.randn(6, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 1, 3, 0, 2, 4])  # row 3 is an empty completion
    mask = (torch.arange(5) < lengths[:, None]).long()  # (6, 5)
    full = grpo.aggregate_loss(per_token, mask, loss_type, max_completion_length=5)
    # train.py's rule: whole-batch token count for dapo (15), number of sequences otherwise (6)
    normalizer = float(mask.sum()) if loss_type == "dapo" else 6.0
    chunks = [slice(0, 2), slice(2, 3), slice(3, 6)]
    summed = sum(grpo.aggregate_loss(per_token[c], mask[c], loss_type, 5, normalizer) for c in chunks)
    assert summed.item() == pytest.approx(full.item(), rel=1e-12)
    # Without the override each chunk normalises by its own count, and the sum is something else.
    naive = sum(grpo.aggregate_loss(per_token[c], mask[c], loss_type, 5) for c in chunks)
    assert abs(naive.item() - full.item()) > 1e-3


def test_clip_higher_hand_computed():
    # Four tokens, one per row; ratios 1.5, 0.5, 0.5, 1.5, 1.25 against A = +1, -1, +1, -1, +1.
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.25], dtype=torch.float64)
    A = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    logps = ratio.log().unsqueeze(1).requires_grad_()  # (5, 1), old log-probs 0
    loss, metrics = grpo.clipped_policy_loss(logps, torch.zeros(5, 1, dtype=torch.float64), A,
                                             torch.ones(5, 1))
    # -min(r A, clip(r, 0.8, 1.28) A):
    #   1.5, A=+1:  -min(1.5, 1.28)   = -1.28  clipped (no gradient)
    #   0.5, A=-1:  -min(-0.5, -0.8)  =  0.8   clipped (no gradient)
    #   0.5, A=+1:  -min(0.5, 0.8)    = -0.5   unclipped: A > 0 may always raise a token
    #   1.5, A=-1:  -min(-1.5, -1.28) =  1.5   unclipped: the pessimistic side is never cut
    #   1.25, A=+1: -min(1.25, 1.25)  = -1.25  inside [0.8, 1.28]; with a symmetric 0.2 it would clip
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5 - 1.25) / 5)
    assert metrics["clip_frac"] == pytest.approx(2 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.5 + 1.25) / 5)
    assert metrics["num_tokens"] == 5 and metrics["kl"] == 0.0  # exact: no reference: KL written as 0, not computed
    loss.backward()
    # d/dlogp of -r A / 5 = -r A / 5 where unclipped, 0 where clipped
    expected = torch.tensor([0, 0, -0.5, 1.5, -1.25], dtype=torch.float64) / 5
    torch.testing.assert_close(logps.grad.squeeze(1), expected)
    _, symmetric = grpo.clipped_policy_loss(logps, torch.zeros(5, 1, dtype=torch.float64), A, torch.ones(5, 1),
                                            epsilon_high=0.2)
    assert symmetric["clip_frac"] == pytest.approx(3 / 5)


def test_k3_kl_hand_computed():
    # d = log pi_ref - log pi = ln 2 and 0: k3 = e^d - d - 1 = 2 - ln 2 - 1 = 0.30685 and 0.
    logps = torch.tensor([[0.0, 0.0, 5.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(2), 0.0, -50.0]], dtype=torch.float64)  # 3rd token masked
    mask = torch.tensor([[1, 1, 0]])
    A = torch.tensor([2.0], dtype=torch.float64)
    k3 = 2 - math.log(2) - 1
    loss, m = grpo.clipped_policy_loss(logps, logps, A, mask, ref_logps=ref, beta=0.1)
    # per token: -ratio * A + beta * k3 = -2 + 0.1 * k3 and -2 + 0; token mean
    assert loss.item() == pytest.approx((-2 + 0.1 * k3 - 2) / 2)
    assert m["kl"] == pytest.approx(k3 / 2)
    # beta = 0 with a reference: KL logged, not added
    loss0, m0 = grpo.clipped_policy_loss(logps, logps, A, mask, ref_logps=ref)
    assert loss0.item() == pytest.approx(-2.0) and m0["kl"] == pytest.approx(k3 / 2)
    with pytest.raises(ValueError, match="ref_logps"):
        grpo.clipped_policy_loss(logps, logps, A, mask, beta=0.1)


def test_truncated_importance_weights_hand_computed():
    # trainer - sampler log-probs: ln 2, -ln 2, ln 4, and a padded token whose values are garbage.
    trainer = torch.tensor([[math.log(2), -math.log(2)], [math.log(4), 7.0]], dtype=torch.float64)
    sampler = torch.zeros(2, 2, dtype=torch.float64)
    sampler[1, 1] = -100.0
    mask = torch.tensor([[1, 1], [1, 0]])
    w = sampler_correction.truncated_importance_weights(trainer, sampler, mask, cap=3.0)
    # exp: 2, 0.5, 4 -> min(., 3) = 2, 0.5, 3; padding -> 1
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [3.0, 1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="cap"):
        sampler_correction.truncated_importance_weights(trainer, sampler, mask, cap=0.0)


def test_token_weights_scale_the_surrogate_not_the_kl():
    # One row, two tokens, on-policy (ratio 1), A = 1: per token surrogate -1, k3 = 0 (ref = pi).
    logps = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    A, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    loss, _ = grpo.clipped_policy_loss(logps, logps.detach(), A, mask, token_weights=w)
    assert loss.item() == pytest.approx((-2.0 - 0.5) / 2)  # token mean of -w_t * ratio * A
    loss.backward()
    torch.testing.assert_close(logps.grad, -w / 2)  # d(-w r A / 2)/dlogp = -w / 2 at r = 1
    # Weights 1 are no weights at all; a KL term is added after the weighting, unscaled.
    plain, _ = grpo.clipped_policy_loss(logps, logps.detach(), A, mask)
    ones, _ = grpo.clipped_policy_loss(logps, logps.detach(), A, mask, token_weights=torch.ones(1, 2))
    assert ones.item() == pytest.approx(plain.item(), rel=1e-12)  # two code paths (weighted and not): float64 rounding only
    ref = torch.tensor([[math.log(2), 0.0]], dtype=torch.float64)  # k3 = 2 - ln 2 - 1 on token 1
    kl_loss, _ = grpo.clipped_policy_loss(logps, logps.detach(), A, mask, ref_logps=ref, beta=1.0, token_weights=w)
    assert kl_loss.item() == pytest.approx((-2.0 + (1 - math.log(2)) - 0.5) / 2)
    with pytest.raises(ValueError, match="token_weights"):
        grpo.clipped_policy_loss(logps, logps.detach(), A, mask, token_weights=torch.ones(2, 1))


def test_loss_ignores_masked_positions():
    g = torch.Generator().manual_seed(1)
    N, T = 4, 6
    logps = -torch.rand(N, T, generator=g, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    ref = logps + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    A = torch.tensor([1.0, -0.5, 0.7, -2.0], dtype=torch.float64)
    mask = (torch.arange(T) < torch.tensor([6, 2, 4, 1])[:, None]).long()
    junk = torch.tensor([float("nan"), 1e4, -1e4, float("inf")], dtype=torch.float64)
    for loss_type in grpo.LOSS_TYPES:
        results = []
        for fill in (None, junk):
            x, o, r = (t.clone() for t in (logps, old, ref))
            if fill is not None:  # overwrite every masked slot of all three inputs with junk
                for t in (x, o, r):
                    t[mask == 0] = fill.repeat(N * T)[: int((mask == 0).sum())]
            x.requires_grad_()
            loss, metrics = grpo.clipped_policy_loss(x, o, A, mask, ref_logps=r, beta=0.05, loss_type=loss_type,
                                                     max_completion_length=T)
            loss.backward()
            results.append((loss.item(), x.grad.clone(), metrics))
        (l0, g0, m0), (l1, g1, m1) = results
        # Same loss, same metrics, and the same gradient everywhere: exactly 0 (not NaN) at masked
        # slots, since a NaN there would flow back into every weight of the model.
        # exact: the same computation: torch.where selects the masked slots away before any arithmetic
        assert l0 == l1 and torch.equal(g0, g1) and m0 == m1
        assert (g1[mask == 0] == 0).all()
        assert math.isfinite(l0)


def test_clipped_policy_loss_gradcheck():
    # Finite differences vs autograd for the whole surrogate + KL, at points away from the clip kinks.
    g = torch.Generator().manual_seed(2)
    N, T = 3, 4
    logps = (-torch.rand(N, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logps.detach() + 0.5 * torch.randn(N, T, generator=g, dtype=torch.float64)
    ref = logps.detach() + 0.5 * torch.randn(N, T, generator=g, dtype=torch.float64)
    A = torch.tensor([1.0, -1.5, 0.3], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    ratio = (logps.detach() - old).exp()
    near_kink = ((ratio - 0.8).abs() < 1e-3) | ((ratio - 1.28).abs() < 1e-3)
    assert not near_kink.any()
    for loss_type in grpo.LOSS_TYPES:
        f = lambda x: grpo.clipped_policy_loss(x, old, A, mask, ref_logps=ref, beta=0.1, loss_type=loss_type,
                                               max_completion_length=T)[0]
        assert torch.autograd.gradcheck(f, (logps,))


# ----------------------------------------------------------------------------------------------
# 3. Per-token log-probs and the whole loss on a tiny Qwen2 (float64)
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         max_position_embeddings=64, initializer_range=0.3)
    model = Qwen2ForCausalLM(config).double().eval()
    # Qwen2RMSNorm normalises in float32 whatever the model's dtype (for bf16 stability). Its
    # 1e-7 rounding, divided by a finite-difference step h = 1e-6, would swamp the derivative, so
    # here the norms compute in float64 like everything else (same formula, no cast).
    for module in model.modules():
        if type(module).__name__ == "Qwen2RMSNorm":
            module.forward = types.MethodType(_rms_norm_float64, module)
    return model


def _rms_norm_float64(self, x):
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


# (prompt, completion) token lists; the collated batch is left-padded to P = 4, right-padded to T = 5.
ROWS = [([3, 4, 5, 6], [7, 8, 9, 2, 2]), ([5, 6], [10, 11]), ([12, 3, 4], [13]), ([8], [14, 15, 16, 17])]
P, T = 4, 5


def collate(rows, left_pad_id=PAD, right_pad_id=PAD):
    """The layout grpo.per_token_logps expects: [pads | prompt | completion | pads]."""
    ids = torch.full((len(rows), P + T), PAD, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, (p, c) in enumerate(rows):
        ids[r, :P - len(p)] = left_pad_id
        ids[r, P - len(p):P] = torch.tensor(p)
        ids[r, P + len(c):] = right_pad_id
        ids[r, P:P + len(c)] = torch.tensor(c)
        attn[r, P - len(p):P + len(c)] = 1
    return ids, attn, attn[:, P:].clone()


def reference_logps(model, rows, temperature=1.0):
    """Each row alone, unpadded, full logits: log_softmax(logits / temperature)[t-1, token t]."""
    out = []
    for p, c in rows:
        seq = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=seq).logits[0] / temperature, dim=-1)  # (len, V)
        out.append([logp[len(p) + t - 1, tok] for t, tok in enumerate(c)])
    return out


def test_per_token_logps_matches_unpadded_reference(model):
    ids, attn, cmask = collate(ROWS)
    for temperature in (1.0, 0.7):
        logps = grpo.per_token_logps(model, ids, attn, T, temperature=temperature)  # (4, 5)
        for r, ref in enumerate(reference_logps(model, ROWS, temperature)):
            torch.testing.assert_close(logps[r, :len(ref)], torch.stack(ref), rtol=1e-10, atol=1e-10)


def test_per_token_logps_micro_batches_slice_and_entropy(model):
    ids, attn, _ = collate(ROWS)
    shapes = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(out.shape)))
    try:
        full, entropy = grpo.per_token_logps(model, ids, attn, T, with_entropy=True)
    finally:
        hook.remove()
    assert shapes == [(4, T + 1, 20)]  # logits_to_keep: only T + 1 positions hit the vocabulary
    micro = grpo.per_token_logps(model, ids, attn, T, micro_batch_size=3)  # chunks of 3 and 1 rows
    torch.testing.assert_close(micro, full, rtol=1e-12, atol=1e-12)

    class NoSlice(torch.nn.Module):  # a causal LM whose forward has no logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    torch.testing.assert_close(grpo.per_token_logps(NoSlice(model), ids, attn, T), full, rtol=1e-12, atol=1e-12)
    # entropy H = -sum_v p log p of the next-token distribution that scored each completion token
    p = torch.softmax(model(input_ids=torch.tensor([ROWS[3][0] + ROWS[3][1]])).logits[0], -1)  # (5, V)
    torch.testing.assert_close(entropy[3, :4], -(p * p.log()).sum(-1)[:4], rtol=1e-10, atol=1e-10)
    assert full.requires_grad and not entropy.requires_grad
    with torch.no_grad():
        assert not grpo.per_token_logps(model, ids, attn, T).requires_grad
    with pytest.raises(ValueError, match="logits_to_keep"):
        grpo.per_token_logps(model, ids, attn, P + T)


def test_padding_ids_change_nothing_but_prompt_tokens_do(model):
    ids, attn, cmask = collate(ROWS)
    base = grpo.per_token_logps(model, ids, attn, T)
    # Left-padding ids (attention-masked) do not change a single log-prob.
    ids_l, _, _ = collate(ROWS, left_pad_id=17)
    # exact: the same computation on the attended tokens: masked keys get weight exp(-inf) = 0
    torch.testing.assert_close(grpo.per_token_logps(model, ids_l, attn, T), base, rtol=0, atol=1e-12)
    # Right padding after a completion's end changes log-probs only at masked positions ...
    ids_r, _, _ = collate(ROWS, right_pad_id=19)
    moved = grpo.per_token_logps(model, ids_r, attn, T)
    # exact: the same computation on earlier tokens: causal attention never reads a later pad
    torch.testing.assert_close(moved[cmask == 1], base[cmask == 1], rtol=0, atol=1e-12)
    assert not torch.allclose(moved[cmask == 0], base[cmask == 0])
    # ... so the loss is unchanged.
    A = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    old = base.detach() + 0.1
    l0, _ = grpo.clipped_policy_loss(base, old, A, cmask)
    l1, _ = grpo.clipped_policy_loss(moved, torch.where(cmask == 1, old, moved.detach()), A, cmask)
    assert abs(l0.item() - l1.item()) < 1e-12
    # The prompt does condition the completion (it just contributes no loss terms of its own).
    changed = [([3, 4, 5, 11], ROWS[0][1])] + ROWS[1:]
    ids_p, _, _ = collate(changed)
    assert (grpo.per_token_logps(model, ids_p, attn, T)[0] - base[0]).abs().max() > 1e-4


def reference_loss(model, rows, old, A, ref, beta, loss_type, eps_low=0.2, eps_high=0.28, max_len=T):
    """GRPO written out token by token with python scalars, from unpadded single-row forwards."""
    logps = reference_logps(model, rows)
    terms = []  # per row: list of per-token losses
    for i, row in enumerate(logps):
        row_terms = []
        for t, logp in enumerate(row):
            ratio = torch.exp(logp - old[i][t])
            clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
            term = -torch.min(ratio * A[i], clipped * A[i])
            d = ref[i][t] - logp
            row_terms.append(term + beta * (torch.exp(d) - d - 1))
        terms.append(row_terms)
    if loss_type == "dapo":
        return sum(sum(r) for r in terms) / sum(len(r) for r in terms)
    if loss_type == "grpo":
        return sum(sum(r) / len(r) for r in terms) / len(terms)
    return sum(sum(r) for r in terms) / (len(terms) * max_len)


@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.0), ("grpo", 0.04), ("dr_grpo", 0.04)])
def test_loss_and_gradient_match_reference_on_tiny_model(model, loss_type, beta):
    ids, attn, cmask = collate(ROWS)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        current = grpo.per_token_logps(model, ids, attn, T)
    # An "old" policy 0.4 nats away per token so that some tokens clip, and a reference nearby.
    old = current + 0.4 * torch.randn(current.shape, generator=g, dtype=torch.float64)
    ref = current + 0.2 * torch.randn(current.shape, generator=g, dtype=torch.float64)
    A = torch.tensor([1.2, -0.8, 0.5, -1.0], dtype=torch.float64)
    params = [p for p in model.parameters()]

    def ours():
        logps = grpo.per_token_logps(model, ids, attn, T, micro_batch_size=3)
        return grpo.clipped_policy_loss(logps, old, A, cmask, ref_logps=ref, beta=beta, loss_type=loss_type,
                                        max_completion_length=T)

    loss, metrics = ours()
    assert 0 < metrics["clip_frac"] < 1 and metrics["num_tokens"] == 12
    grads = torch.autograd.grad(loss, params)
    expected = reference_loss(model, ROWS, old, A, ref, beta, loss_type)
    expected_grads = torch.autograd.grad(expected, params)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    # Finite difference along one random direction in parameter space: (f(+h) - f(-h)) / 2h = grad . v
    v = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    h = 1e-6
    with torch.no_grad():
        for p, d in zip(params, v):
            p.add_(h * d)
        up = ours()[0].item()
        for p, d in zip(params, v):
            p.sub_(2 * h * d)
        down = ours()[0].item()
        for p, d in zip(params, v):
            p.add_(h * d)
    directional = sum((gr * d).sum() for gr, d in zip(grads, v)).item()
    assert (up - down) / (2 * h) == pytest.approx(directional, rel=1e-6, abs=1e-9)


def test_on_policy_ratio_is_one_and_gradient_is_plain_policy_gradient(model):
    ids, attn, cmask = collate(ROWS)
    logps, entropy = grpo.per_token_logps(model, ids, attn, T, with_entropy=True)
    logps.retain_grad()
    A = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    with torch.no_grad():
        ref = grpo.per_token_logps(model, ids, attn, T)  # reference = policy: KL 0
    loss, m = grpo.clipped_policy_loss(logps, logps.detach(), A, cmask, ref_logps=ref, beta=0.1, entropy=entropy)
    assert m["ratio_mean"] == 1.0 and m["clip_frac"] == 0.0 and abs(m["kl"]) < 1e-6 and m["num_tokens"] == 12.0  # exact: ratio exp(0) = 1 and counts; KL: ref is a second forward pass, float32 k3 rounding ~1e-7
    assert m["entropy"] == pytest.approx(float(entropy[cmask == 1].mean()))
    # At ratio 1: loss = -(sum_i A_i |o_i|) / K with |o| = (5, 2, 1, 4), K = 12
    assert loss.item() == pytest.approx(-(1 * 5 - 1 * 2 + 0.5 * 1 - 2 * 4) / 12)
    loss.backward()
    # dloss/dlogp_it = -A_i / K on completion tokens (REINFORCE with a group baseline), 0 elsewhere
    expected = torch.where(cmask == 1, -A[:, None] / 12, torch.zeros_like(logps))
    torch.testing.assert_close(logps.grad, expected, rtol=1e-12, atol=1e-15)


def test_half_precision_model_gives_float32_logps(model):
    # A bf16 policy (as on GPU) is scored in float32: log-softmax over V entries in bf16 loses digits.
    ids, attn, _ = collate(ROWS)
    with torch.no_grad():
        exact = grpo.per_token_logps(model, ids, attn, T)
        half = grpo.per_token_logps(copy.deepcopy(model).bfloat16(), ids, attn, T)
    assert half.dtype == torch.float32
    # bf16 weights keep ~3 significant digits; measured max error 0.07 nats here
    torch.testing.assert_close(half.double(), exact, rtol=0, atol=0.15)


def test_group_advantages_of_an_empty_batch():
    """N = 0 rollouts (mutation testing found no case): nothing to score, no groups, no error."""
    adv, stats = grpo.group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.shape == (0,) and stats["num_groups"] == 0 and stats["zero_signal_rollouts"] == 0


# ----------------------------------------------------------------------------------------------
# 5. App. C's update: the plain grpo.policy_update against the one train.py runs
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_type, beta, mini_batches", [("dapo", 0.0, 2), ("grpo", 0.04, 3), ("dr_grpo", 0.0, 1)])
def test_plain_policy_update_matches_engines_update(model, loss_type, beta, mini_batches):
    """Same weights after (and the same logged loss, grad_norm, clip_frac) as engines/update.py's
    policy_update in one process, which accumulates micro-batches of 3 rows and takes pi_old from its
    own forward in the first mini-batch: float64, so they agree to ~1e-12, not bit for bit (other
    batch groupings round differently)."""
    from engines import update

    rows = ROWS + [(p, c[::-1]) for p, c in ROWS]  # 8 rows, each prompt twice
    ids, attn, cmask = collate(rows)
    batch = {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask,
             "advantages": torch.tensor([1.2, -0.8, 0.5, -1.0, -0.3, 0.9, -0.5, 1.1], dtype=torch.float64)}
    args = types.SimpleNamespace(num_mini_batches=mini_batches, micro_batch_size=3, temperature=0.9, epsilon=0.2,
                                 epsilon_high=0.28, beta=beta, loss_type=loss_type, max_completion_length=T,
                                 max_grad_norm=0.5)
    ref_model = copy.deepcopy(model) if beta else None
    results = []
    for fn in (grpo.policy_update, update.policy_update):
        m = copy.deepcopy(model)
        optimizer = torch.optim.SGD(m.parameters(), lr=2.0)  # large: the later mini-batches' ratio moves off 1
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
        metrics = fn(m, optimizer, scheduler, batch, args, ref_model, gen_seed=5)
        results.append((metrics, torch.cat([p.detach().flatten() for p in m.parameters()])))
    (plain, w_plain), (full, w_full) = results
    w0 = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (w_plain - w0).norm() > 1e-3  # the update moved the weights
    torch.testing.assert_close(w_plain, w_full, rtol=0, atol=1e-10)
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "kl", "entropy", "num_tokens"):
        assert plain[key] == pytest.approx(full[key], rel=1e-9, abs=1e-12), key
    if mini_batches > 1:
        assert plain["ratio_mean"] != pytest.approx(1.0, abs=1e-6)  # pi_old mattered

"""App. C's update where the inputs that tests/test_grpo.py's plain-vs-engine test leaves equal differ:
the plain grpo.policy_update and the one train.py runs (engines/update.py:policy_update) against an
oracle written here from the formulas alone. Issue 54, part 3.

tests/test_grpo.py compares the two updates with a reference model that is a copy of the starting
policy and pi_old that is the trainer's own forward, so a version reading pi_ref off the policy, or
the trainer's pi_old where the sampler's was given, passes it. Here:
  - the reference model's weights are perturbed away from the policy's, with beta > 0 (k3 KL);
  - pi_old comes from the sampler (HF generate's own log-probs, batch["old_logps"], what
    --sampler-logps passes; rollout.SampledTokenLogps) and differs from the trainer's;
  - vLLM's sampler log-probs (batch["sampler_logps"]) differ from the trainer's and the truncated
    importance-sampling weights are on (--vllm-importance-sampling-cap; engines/sampler_correction);
  - the shared-prompt forward (--shared-prompt-forward, speedups/shared_prompt.py) against the plain
    forward, on prompts of different lengths (left padding) with repeats;
  - bf16 autocast on CPU (the engine's forward under torch.autocast), within a bf16 tolerance.

The oracle (oracle_update) uses neither grpo.py nor engines/: each row alone, unpadded, through the
full logits (log_softmax / temperature at the completion's positions), the clipped surrogate with
clip-higher, the TIS weight min(pi_trainer / pi_sampler, cap) on the surrogate only, k3 KL, the
"dapo" / "grpo" aggregation per mini-batch, grad-norm clipping and SGD, one step per mini-batch
over torch.randperm(N, seed)'s split (the same shuffle both updates draw). Its pi_old follows the
engine's documented contract (engines/update.py:frozen_logps): the trainer's log-probs at rollout
time, except that generation's own log-probs (batch["old_logps"]) are read from the second
mini-batch on; the first mini-batch's pi_old is its own forward (the policy has not moved).

Tolerances: float64 throughout (the RMSNorm too, see model()), so the updates differ from the
oracle only by float64 rounding in other groupings (measured <= 1e-14 relative); the check is
1e-8 of the weight change (1e-9 relative on metrics), far above that and far below what any
broken version moves (>= 1e-3 relative, measured). bf16 autocast: 5% of the weight change and
0.02 absolute on the loss and KL (bf16 keeps ~3 significant digits; measured ~1%).

Broken versions these tests fail on (each applied to a clean copy of the code, never committed):
  - grpo.policy_update taking pi_ref from the policy (passes tests/test_grpo.py);
  - engines/update.py ignoring the IS weights (token_weights=None), or computing them from the
    current forward instead of pi_old, or taking pi_ref from the policy;
  - engines/update.py taking pi_old from the trainer instead of batch["old_logps"];
  - the shared-prompt forward with the completion's positions one column early, or counted from
    column 0 instead of from each row's first real token (left padding ignored).
Run: python -m pytest -q tests/test_update_equivalence.py  (about 10 s on one CPU core)
"""
import copy
import types

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import grpo
from engines import update

PAD = 0
# (prompt, completion) token lists: prompts of lengths 4, 2, 3, 1 (left padding differs), repeated
# 3, 2, 1, 2 times (the shared-prompt forward's groups; one prompt alone), completions ragged.
ROWS = [([3, 4, 5, 6], [7, 8, 9, 2, 2]), ([3, 4, 5, 6], [10, 11]), ([3, 4, 5, 6], [13, 7, 8, 9]),
        ([5, 6], [10, 11, 12]), ([5, 6], [14]),
        ([12, 3, 4], [13, 9, 9, 15, 16]),
        ([8], [14, 15, 16, 17]), ([8], [17, 3])]
P, T = 4, 5
ADV = [1.2, -0.8, 0.5, -1.0, 0.7, 0.9, -0.5, 1.1]


def _rms_norm_float64(self, x):
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def tiny_qwen2(dtype, init=0.3):
    """A 2-layer Qwen2 (RoPE, GQA), seeded; init 0.3 gives sharp distributions (large gradients, clipped).
    float64: the RMSNorms compute in float64 too (Qwen2RMSNorm casts to float32 whatever the model's
    dtype, which would put 1e-7 noise into float64 checks)."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         max_position_embeddings=64, initializer_range=init)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    if dtype == torch.float64:
        as_float64(model)
    return model


def as_float64(model):
    model.double()
    for module in model.modules():
        if type(module).__name__ == "Qwen2RMSNorm":
            module.forward = types.MethodType(_rms_norm_float64, module)
    return model


def perturbed(model, scale=0.05, seed=1):
    """A reference model away from the policy: every weight plus N(0, scale^2) noise."""
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return ref


def collate(rows):
    """[pads | prompt | completion | pads]: ids, attention mask (N, P + T), completion mask (N, T)."""
    ids = torch.full((len(rows), P + T), PAD, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, (p, c) in enumerate(rows):
        ids[r, P - len(p):P] = torch.tensor(p)
        ids[r, P:P + len(c)] = torch.tensor(c)
        attn[r, P - len(p):P + len(c)] = 1
    return ids, attn, attn[:, P:].clone()


def weights(model):
    return torch.cat([p.detach().flatten().double() for p in model.parameters()])


# ----------------------------------------------------------------------------------------------
# The oracle: App. C's update from the formulas, one unpadded row at a time
# ----------------------------------------------------------------------------------------------
def row_logps(model, prompt, completion, temperature):
    """log pi(o_t | q, o_<t) of each completion token: the row alone, no padding, full logits."""
    seq = torch.tensor([prompt + completion])
    logp = torch.log_softmax(model(input_ids=seq).logits[0] / temperature, dim=-1)  # (len, V)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)  # logit j predicts token j + 1
    return logp[pos, torch.tensor(completion)]  # (len(completion),)


def oracle_update(model, ref_model, args, gen_seed, lr, old_from_sampler=None, sampler=None, cap=None):
    """(metrics, weight change) of App. C's update on ROWS. old_from_sampler: per row, generation's
    own log pi_old (read from the second mini-batch on, as the engine's contract says); sampler: per
    row, vLLM's log-probs, for the TIS weights w_t = min(pi_trainer_old / pi_sampler, cap)."""
    m = copy.deepcopy(model)
    before = weights(m)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    temp = args.temperature
    with torch.no_grad():
        trainer_old = [row_logps(m, p, c, temp) for p, c in ROWS]  # the trainer's pi_old at rollout time
        ref = [row_logps(ref_model, p, c, temp) for p, c in ROWS] if ref_model is not None else None
    N = len(ROWS)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(gen_seed))
    chunks = torch.chunk(perm, min(args.num_mini_batches, N))
    tokens = sum(len(c) for _, c in ROWS)
    out = {"loss": 0.0, "kl": 0.0, "ratio_mean": 0.0, "vllm_logp_gap": 0.0, "vllm_is_weight_mean": 0.0}
    for k, chunk in enumerate(chunks):
        K = sum(len(ROWS[r][1]) for r in chunk.tolist())
        loss = 0.0
        for r in chunk.tolist():
            p, c = ROWS[r]
            lp = row_logps(m, p, c, temp)  # (|o|,) with gradient
            old = trainer_old[r] if old_from_sampler is None or k == 0 else old_from_sampler[r]
            ratio = torch.exp(lp - old)
            A = ADV[r]
            surrogate = -torch.minimum(ratio * A, torch.clamp(ratio, 1 - args.epsilon, 1 + args.epsilon_high) * A)
            if sampler is not None:
                w = torch.clamp(torch.exp(trainer_old[r] - sampler[r]), max=cap)
                surrogate = surrogate * w
                out["vllm_logp_gap"] += float((trainer_old[r] - sampler[r]).abs().sum()) / tokens
                out["vllm_is_weight_mean"] += float(w.sum()) / tokens
            per_token = surrogate
            if ref is not None:
                d = ref[r] - lp
                kl = torch.exp(d) - d - 1
                per_token = per_token + args.beta * kl
                out["kl"] += float(kl.detach().sum()) / tokens
            out["ratio_mean"] += float(ratio.detach().sum()) / tokens
            if args.loss_type == "dapo":  # every token of the mini-batch weighs 1 / K
                loss = loss + per_token.sum() / K
            else:  # "grpo": the mean over each row's tokens, then over the mini-batch's rows
                loss = loss + per_token.mean() / len(chunk)
        loss.backward()
        out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(m.parameters(), args.max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["loss"] += float(loss.detach()) / len(chunks)
    return out, weights(m) - before


def run_update(fn, model, batch, args, ref_model, gen_seed, lr, **kw):
    """(metrics, weight change) of grpo.policy_update or engines/update.policy_update on a copy."""
    m = copy.deepcopy(model)
    before = weights(m)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    metrics = fn(m, opt, sched, batch, args, ref_model, gen_seed=gen_seed, **kw)
    return metrics, weights(m) - before


def run_engine(model, batch, args, ref_model, gen_seed, lr, **kw):
    """run_update of engines/update.py's policy_update; checks that --shared-prompt-forward took the
    shared path (a forward on a KV cache of the prompts) exactly when asked, so a batch that stopped
    repeating prompts inside a micro-batch cannot make the shared-forward checks compare plain with plain."""
    cached = []
    hook = model.register_forward_pre_hook(  # deepcopy in run_update copies the hook to the updated model
        lambda module, a, kwargs: cached.append(kwargs.get("past_key_values") is not None), with_kwargs=True)
    try:
        out = run_update(update.policy_update, model, batch, args, ref_model, gen_seed, lr, **kw)
    finally:
        hook.remove()
    assert any(cached) == bool(args.shared_prompt_forward) and cached
    return out


def make_args(**kw):
    base = dict(num_mini_batches=2, micro_batch_size=3, temperature=0.9, epsilon=0.2, epsilon_high=0.28,
                beta=0.1, loss_type="dapo", max_completion_length=T, max_grad_norm=1.0,
                shared_prompt_forward=False, vllm_importance_sampling_cap=None)
    return types.SimpleNamespace(**{**base, **kw})


def per_row(tensor):
    """(N, T) padded -> per row, its completion's entries."""
    return [tensor[r, :len(c)] for r, (_, c) in enumerate(ROWS)]


def assert_same_update(got, want, rel, metric_keys, what):
    (m_got, step_got), (m_want, step_want) = got, want
    assert step_want.norm() > 1e-3, what  # the update moved the weights
    assert (step_got - step_want).norm() <= rel * step_want.norm(), (what, float((step_got - step_want).norm()
                                                                               / step_want.norm()))
    for key in metric_keys:
        assert m_got[key] == pytest.approx(m_want[key], rel=1e-9, abs=1e-12), (what, key)


@pytest.fixture(scope="module")
def model64():
    return tiny_qwen2(torch.float64)


@pytest.fixture(scope="module")
def batch():
    ids, attn, cmask = collate(ROWS)
    return {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask,
            "advantages": torch.tensor(ADV, dtype=torch.float64)}


def trainer_logps(model, temperature):
    """(N, T) the trainer's log-probs of ROWS' completions (oracle's forward), 0.0 on padding."""
    out = torch.zeros(len(ROWS), T, dtype=torch.float64)
    with torch.no_grad():
        for r, (p, c) in enumerate(ROWS):
            out[r, :len(c)] = row_logps(model, p, c, temperature)
    return out


def noise(scale, seed):
    return scale * (2 * torch.rand(len(ROWS), T, generator=torch.Generator().manual_seed(seed),
                                   dtype=torch.float64) - 1)  # uniform in [-scale, scale]


# ----------------------------------------------------------------------------------------------
# 1. A reference model away from the policy, beta > 0: plain, engine, engine + shared prompt
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_type, mini_batches", [("dapo", 2), ("grpo", 3)])
def test_perturbed_reference_plain_and_engine_equal_the_oracle(model64, batch, loss_type, mini_batches):
    ref_model = perturbed(model64)
    args = make_args(loss_type=loss_type, num_mini_batches=mini_batches, beta=0.2)
    want = oracle_update(model64, ref_model, args, gen_seed=5, lr=2.0)
    # the reference matters: its KL at the start is far from the 0 a copy of the policy would give
    assert want[0]["kl"] > 1e-3
    keys = ("loss", "kl", "ratio_mean", "grad_norm")
    plain = run_update(grpo.policy_update, model64, batch, args, ref_model, 5, 2.0)
    assert_same_update(plain, want, 1e-8, keys, "plain")
    for shared in (False, True):
        got = run_engine(model64, batch, make_args(**{**vars(args), "shared_prompt_forward": shared}), ref_model, 5, 2.0)
        assert_same_update(got, want, 1e-8, keys, f"engine shared={shared}")
    # and without the KL term the reference would not matter: beta moves the update
    no_kl = oracle_update(model64, ref_model, make_args(loss_type=loss_type, num_mini_batches=mini_batches, beta=0.0),
                          gen_seed=5, lr=2.0)
    assert (no_kl[1] - want[1]).norm() > 1e-3 * want[1].norm()


# ----------------------------------------------------------------------------------------------
# 2. pi_old from the sampler (HF generate's own log-probs, batch["old_logps"]), not the trainer's
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_sampler_old_logps_differing_from_the_trainers(model64, batch, shared):
    ref_model = perturbed(model64)
    args = make_args(num_mini_batches=3, shared_prompt_forward=shared)
    sampler_old = trainer_logps(model64, args.temperature) + noise(0.3, seed=2)  # (N, T), off by up to 0.3 nats
    want = oracle_update(model64, ref_model, args, 6, 2.0, old_from_sampler=per_row(sampler_old))
    got = run_engine(model64, {**batch, "old_logps": sampler_old * batch["completion_mask"]}, args, ref_model, 6, 2.0)
    assert_same_update(got, want, 1e-8, ("loss", "kl", "ratio_mean", "grad_norm"), f"shared={shared}")
    # the sampler's pi_old matters: the trainer's would give another update
    trainer_old = oracle_update(model64, ref_model, args, 6, 2.0)
    assert (trainer_old[1] - want[1]).norm() > 1e-2 * want[1].norm()


# ----------------------------------------------------------------------------------------------
# 3. vLLM's sampler log-probs with truncated importance sampling on
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_truncated_importance_weights_against_the_oracle(model64, batch, shared):
    ref_model = perturbed(model64)
    cap = 1.5
    args = make_args(vllm_importance_sampling_cap=cap, shared_prompt_forward=shared)
    trainer = trainer_logps(model64, args.temperature)
    sampler = (trainer + noise(0.6, seed=3)).float()  # vLLM's float32 log-probs, off by up to 0.6 nats
    m = batch["completion_mask"].bool()
    w = torch.exp(trainer - sampler.double())[m]
    assert int((w > cap).sum()) >= 3 and int(((w - 1).abs() > 0.1).sum()) >= 10  # weights capped and far from 1
    want = oracle_update(model64, ref_model, args, 7, 2.0, sampler=per_row(sampler.double()), cap=cap)
    got = run_engine(model64, {**batch, "sampler_logps": sampler * m}, args, ref_model, 7, 2.0)
    keys = ("loss", "kl", "ratio_mean", "grad_norm", "vllm_logp_gap", "vllm_is_weight_mean")
    assert_same_update(got, want, 1e-8, keys, f"shared={shared}")
    # the weights matter: without them the update differs
    unweighted = oracle_update(model64, ref_model, args, 7, 2.0)
    assert (unweighted[1] - want[1]).norm() > 1e-2 * want[1].norm()


# ----------------------------------------------------------------------------------------------
# 4. Everything at once under bf16 autocast (CPU), against the float64 oracle
# ----------------------------------------------------------------------------------------------
def test_bf16_autocast_engine_with_everything_on_against_the_oracle(batch):
    """A float32 policy (autocast leaves float64 alone), its forward under torch.autocast("cpu",
    bfloat16) as train.py runs it; the oracle on a float64 copy of the same weights. A milder model
    (init 0.1: with 0.3, log-probs reach ~5 nats of spread and bf16 moves the clipped steps by 3-50%,
    chaotically). Tolerance: bf16 keeps ~3 significant digits; measured here the weight change moves by
    1.3% and the loss and KL by <= 1e-3; the checks allow 8% of the weight change (ignoring the IS
    weights moves it by ~35%) and 0.01 absolute on the loss, KL and mean IS weight."""
    model32 = tiny_qwen2(torch.float32, init=0.1)
    ref32 = perturbed(model32, scale=0.1 / 6)
    model_ref64, ref_ref64 = as_float64(copy.deepcopy(model32)), as_float64(copy.deepcopy(ref32))
    cap = 1.5
    args = make_args(num_mini_batches=3, shared_prompt_forward=True, vllm_importance_sampling_cap=cap)
    trainer = trainer_logps(model_ref64, args.temperature)
    sampler = (trainer + noise(0.6, seed=4)).float()
    m = batch["completion_mask"].bool()
    want = oracle_update(model_ref64, ref_ref64, args, 8, 0.1, sampler=per_row(sampler.double()), cap=cap)
    amp = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    b32 = {**batch, "advantages": batch["advantages"].float(), "sampler_logps": sampler * m}
    got = run_engine(model32, b32, args, ref32, 8, 0.1, autocast=amp)
    (m_got, step_got), (m_want, step_want) = got, want
    assert step_want.norm() > 1e-3
    assert (step_got - step_want).norm() <= 0.08 * step_want.norm(), float((step_got - step_want).norm() / step_want.norm())
    for key in ("loss", "kl", "vllm_is_weight_mean"):
        assert abs(m_got[key] - m_want[key]) <= 0.01, key
    assert m_want["kl"] > 1e-2  # the reference is away from the policy

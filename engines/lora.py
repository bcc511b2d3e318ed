"""LoRA for the policy (--use-peft): a trainer that fits a 16-24 GB GPU, with the same GRPO / CoBA-RL loop.

Not part of CoBA-RL (arXiv 2602.03048 trains all weights, App. C): ours, a flag, for students'
GPUs. LoRA (Hu et al. 2021, arXiv 2106.09685) freezes every weight W of the base model and trains,
beside each wrapped linear layer, two small matrices A (r, d_in) and B (d_out, r); the layer computes

    h = W x + s * B A x,        s = lora_alpha / r        (B starts at 0: the policy starts as the base)

peft 0.21.2 does the wrapping. The flags and defaults are TRL's (trl/trainer/model_config.py:
--use-peft, --lora-r 16, --lora-alpha 32, --lora-dropout 0.05, --lora-target-modules), except that
target modules default to `all-linear` (ours: TRL's None means peft's per-model default, q_proj and
v_proj on Qwen2). Qwen2.5-1.5B, r = 16 on all linear layers: 18,464,768 trainable parameters (1.2%).

What this file gives train.py, engines/rollout.py and engines/checkpoint.py (each keeps one call into it):
  wrap                 inject the adapter into the loaded transformers model (model.add_adapter,
                       peft's inject_adapter_in_model), LoRA weights in fp32 over a frozen base
  WithoutAdapter       the KL reference of --beta > 0 for free: the policy with its adapter switched
                       off is exactly the base model, so no second copy of the model is loaded
  reference_model      train.py's choice of that reference: WithoutAdapter with --use-peft, else a
                       frozen copy of the initial policy
  engine_weights       what vLLM receives: W + s * B A per wrapped layer, computed in fp32 under the
                       base model's parameter names; the base itself is never written
  read_adapter, load_adapter, save_merged
                       checkpoints hold the adapter (peft's file) and the optimizer state; the final
                       one also a merged model (merged/) that plain `from_pretrained` loads
Why the model stays a transformers model (add_adapter) and not peft's PeftModel wrapper: PeftModel's
forward takes **kwargs, so inspect.signature no longer shows position_ids, logits_to_keep and
past_key_values, and grpo.per_token_logps and rollout's shared prefill would quietly drop them
(position ids are what keep left-padded rows at the positions they were generated at). The
reference context is then `disable_adapters()`/`enable_adapters()` (transformers' names for what
PeftModel's `with model.disable_adapter():` does).
Why no merge/unmerge for the engine: merging adds s * B A into W in W's dtype and unmerging
subtracts it again; in bf16 that does not give W back (on the toy, 10 cycles changed 125,125 of
790,784 base values, max 2.9e-3): the frozen base would drift every step. engine_weights adds in a
new fp32 tensor instead, so the base stays bit-identical (tests/test_lora.py checks both).
Tests: tests/test_lora.py.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from pathlib import Path

import torch

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_FILE = "adapter_model.safetensors"  # what save_pretrained writes for a model with an adapter
SAVED_PREFIX = "base_model.model."  # peft's file keys: PeftModel's path to the transformers model


def is_lora(model) -> bool:
    """True for a model that wrap() gave an adapter (transformers' PeftAdapterMixin flag)."""
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def lora_config(args):
    from peft import LoraConfig

    targets = args.lora_target_modules
    return LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules=targets[0] if targets == ["all-linear"] else list(targets),
                      bias="none", task_type="CAUSAL_LM")


def lora_layers(model) -> dict:
    """{module path: peft LoRA Linear} of every wrapped layer."""
    from peft.tuners.lora.layer import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def wrap(model, args):
    """Inject the adapter into `model` in place and return it: base weights frozen (requires_grad
    False), LoRA's A and B trainable and fp32 whatever the base's dtype (a bf16 base is fine frozen,
    but AdamW's ~1e-5 steps would round away in bf16 LoRA weights, as in --bf16's help)."""
    from peft.tuners.lora.layer import Linear

    try:
        with warnings.catch_warnings():  # peft's warning on a tied target: refused below in one line instead
            warnings.filterwarnings("ignore", message="Model has `tie_word_embeddings=True` and a tied layer")
            model.add_adapter(lora_config(args), adapter_name=ADAPTER)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SystemExit(f"error: --lora-target-modules {' '.join(args.lora_target_modules)}: {first}: "
                         "name linear layers of the model (e.g. q_proj v_proj) or pass all-linear")
    layers = lora_layers(model)
    other = sorted({type(m).__name__ for m in layers.values() if not isinstance(m, Linear)})
    if other:  # engine_weights' delta s * B A is the linear layers' formula (embeddings transpose it)
        raise SystemExit(f"error: --lora-target-modules wraps {', '.join(other)} layers; only linear "
                         "layers are supported: name linear layers (e.g. q_proj v_proj) or pass all-linear")
    # A wrapped layer whose weight is tied to another parameter (lm_head to embed_tokens: the toy labs,
    # Qwen2.5-0.5B and 1.5B) would change the policy's logits, but the tied weight is one tensor, which
    # named_parameters lists once, under the embedding's name: engine_weights (vLLM, merged/) would carry
    # W without s * B A, and the engine would sample from another policy. Refused; peft only warns.
    shared = tied_names(model)
    tied = sorted(owner.rsplit(".", 1)[-1] for owner in layers if f"{owner}.base_layer.weight" in shared)
    if tied:
        raise SystemExit(f"error: --lora-target-modules {' '.join(args.lora_target_modules)}: {', '.join(tied)} shares "
                         "its weight with the input embedding (tie_word_embeddings), so its LoRA update could reach "
                         f"neither vLLM nor merged/: drop {', '.join(tied)} from --lora-target-modules (all-linear "
                         "leaves the output layer out), or use a model whose output layer is not tied")
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
        if ".lora_" in name:
            p.data = p.data.float()
    if getattr(args, "gradient_checkpointing", False):
        # checkpointed layers recompute from their inputs; with the embeddings frozen those carry no
        # grad, and a re-entrant checkpoint would then give LoRA no gradient (peft's usual fix)
        model.enable_input_require_grads()
    return model


def tied_names(model) -> set[str]:
    """Names of parameters that are one tensor under several names (a tied lm_head.weight and
    model.embed_tokens.weight): every name of every such tensor."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {n for group in names.values() if len(group) > 1 for n in group}


def trainable_counts(model) -> tuple[int, int]:
    """(trainable parameters, all parameters): 155,648 of 946,432 on the toy at r = 16."""
    return (sum(p.numel() for p in model.parameters() if p.requires_grad),
            sum(p.numel() for p in model.parameters()))


# ----------------------------------------------------------------------------------------------
# The free KL reference (--beta > 0): the policy with its adapter off is the base model
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def adapter_disabled(model):
    """Every LoRA layer computes W x alone inside the block (PeftModel's disable_adapter())."""
    model.disable_adapters()
    try:
        yield model
    finally:
        model.enable_adapters()


class WithoutAdapter:
    """The reference model pi_ref of the k3 KL term, as a callable model: the policy's own forward
    with the adapter switched off. Its forward keeps the model's signature (functools.wraps), so
    grpo.per_token_logps passes it position_ids and logits_to_keep as it would the policy."""

    def __init__(self, model):
        self.model = model

        @functools.wraps(model.forward)
        def forward(*args, **kwargs):
            with adapter_disabled(model):
                return model(*args, **kwargs)
        self.forward = forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def reference_model(model, args, load):
    """pi_ref of the k3 KL term (--beta > 0; None without one), the initial policy frozen. With
    --use-peft the policy with its adapter off (WithoutAdapter: the base under the adapter is the
    initial policy, no copy); a full model needs a second copy, load() (its weights in bf16 with
    --bf16: enough for log-probs), frozen."""
    if not args.beta > 0:
        return None
    if args.use_peft:
        return WithoutAdapter(model)
    ref_model = load()
    ref_model.eval().requires_grad_(False)
    return ref_model


# ----------------------------------------------------------------------------------------------
# Weights for vLLM and for the merged model: W + s * B A, in fp32, under the base model's names
# ----------------------------------------------------------------------------------------------
def lora_delta(layer) -> torch.Tensor:
    """s * B A of one peft LoRA Linear in fp32: (d_out, d_in), the shape of its base weight."""
    A = layer.lora_A[ADAPTER].weight.detach().float()  # (r, d_in)
    B = layer.lora_B[ADAPTER].weight.detach().float()  # (d_out, r)
    delta = layer.scaling[ADAPTER] * (B @ A)  # (d_out, d_in)
    return delta.T if layer.fan_in_fan_out else delta


@torch.no_grad()
def engine_weights(model) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter of the base model, named as the base checkpoint names it
    (`...q_proj.weight`, not `...q_proj.base_layer.weight`), the LoRA matrices left out. A wrapped
    layer's weight is W + s * B A in a new fp32 tensor (W itself untouched, whatever its dtype);
    the rest are the parameters themselves. named_parameters order and ties: a tied lm_head
    appears once, under embed_tokens, as rollout.VLLMGenerator pushes a full model."""
    layers = lora_layers(model)
    out = []
    for name, p in model.named_parameters():
        if ".lora_" in name:
            continue
        owner, sep, leaf = name.partition(".base_layer.")
        if not sep:
            out.append((name, p.detach()))
        elif leaf == "weight" and not layers[owner].disable_adapters:
            out.append((f"{owner}.weight", p.detach().float() + lora_delta(layers[owner])))
        else:  # the bias (LoRA has none: bias="none"), or an adapter switched off
            out.append((f"{owner}.{leaf}", p.detach()))
    return out


# ----------------------------------------------------------------------------------------------
# Checkpoints: the adapter (peft's file, written by model.save_pretrained), and the merged model
# ----------------------------------------------------------------------------------------------
def read_adapter(path: Path) -> dict[str, torch.Tensor]:
    """The adapter file a checkpoint holds (peft's keys: base_model.model.<path>.lora_A.weight)."""
    from safetensors.torch import load_file

    return load_file(Path(path) / ADAPTER_FILE)


def load_adapter(model, saved: dict[str, torch.Tensor]) -> None:
    """Copy a saved adapter into the model's LoRA weights, bit for bit (fp32 both sides). Every LoRA
    weight must be in the file and nothing else: a file from another --lora-r or other target modules
    is refused in one line rather than half loaded."""
    params = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    wanted = {n.removeprefix(SAVED_PREFIX).replace(".weight", f".{ADAPTER}.weight"): t for n, t in saved.items()}
    missing, extra = sorted(params.keys() - wanted.keys()), sorted(wanted.keys() - params.keys())
    bad = [n for n in params.keys() & wanted.keys() if params[n].shape != wanted[n].shape]
    if missing or extra or bad:
        raise SystemExit(f"error: the checkpoint's adapter does not fit this model's ({len(missing)} LoRA weights "
                         f"missing, {len(extra)} unknown, {len(bad)} of another shape, e.g. "
                         f"{(missing + extra + bad)[0]}): resume with the run's own --lora-* flags")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(wanted[name])


def save_merged(model, tokenizer, out: Path) -> None:
    """A plain transformers model directory: config, the engine's fp32 weights W + s * B A (not
    rounded back to the base's dtype), generation config and tokenizer. AutoModelForCausalLM.
    from_pretrained(out) loads it without peft; a tied lm_head is re-tied from embed_tokens."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weights = {name: t.contiguous() for name, t in engine_weights(model)}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    config.dtype = torch.float32  # what the file holds (a bf16 base's config says bfloat16)
    config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)

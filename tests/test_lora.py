"""LoRA (--use-peft, engines/lora.py) on the toy, on CPU. Run: python -m pytest -q tests/test_lora.py

What each test pins down, with the mutation it catches:
  - a step moves LoRA's A and B only, the base stays bit-identical (a base left trainable);
  - the KL reference (--beta > 0) gives the base model's log-probs (up to rounding), and the adapter is on
    again afterwards (a reference that is the policy itself, or an adapter left off);
  - the weights the stand-in vLLM receives are W + s * B A under the base's names: loaded into a
    plain model they give the policy's log-probs (a push of W alone, or of the wrong names);
  - 50 pushes leave a bf16 base bit-identical, where peft's merge/unmerge drifts it;
  - --resume continues exactly, and the final checkpoint's merged/ loads with plain transformers;
  - train.py --use-peft (20 steps) and gpu_check.py --tiny --use-peft run; bad LoRA flags are one line;
  - a tied lm_head as a target is refused in one line (its update would reach neither vLLM nor merged/),
    an untied one is pushed as W + s * B A.
Tolerances: fp32 throughout; W x + s * B (A x) and (W + s * B A) x differ only in float
association: ~1e-6 in a log-prob, up to 1.05e-5 measured on a trained adapter (log-probs near -7 to -17,
where a float32 step is ~1e-6), so ASSOCIATION = 1e-4 is the bound, still 100x below what a missing
delta gives (> 1e-2).
"""
import copy
import json
import types

import pytest
import torch

import grpo
from engines import lora
from engines import rollout
import train
from harness import run as run_setup
from test_rollout import FakeVLLM

SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
         "--eval-every", "0", "--no-progress", "--max-budget", "12"]
QUESTIONS = ["2+3=", "9*9=", "40-7=", "47*38="]
ROUNDING = 1e-4  # |log-prob| gap of two routes to the same product (test_reference_is_the_base_model_up_to_rounding)
ASSOCIATION = 1e-4  # |log-prob| gap of W x + s B (A x) against (W + s B A) x: float association only (docstring)


def lora_args(**kw):
    return types.SimpleNamespace(**{**dict(lora_r=16, lora_alpha=32.0, lora_dropout=0.05,
                                           lora_target_modules=["all-linear"], gradient_checkpointing=False), **kw})


def base_model(toy_model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(toy_model_dir, dtype=dtype)


def moved_adapter(model, seed=0):
    """Give every B a random value (B = 0 at init makes the policy the base): another policy."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def rows(toy_model_dir):
    """(input_ids, attention_mask, T): 4 prompts, each with a fixed 5-token completion."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(toy_model_dir)
    prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]
    completions = [tok(c, add_special_tokens=False)["input_ids"] for c in ["5", "81", "33", "1786"]]
    ids, attn, cmask = rollout.collate(prompts, completions, tok.pad_token_id)
    return ids, attn, cmask.shape[1]


@torch.no_grad()
def logps(model, batch):
    ids, attn, T = batch
    return grpo.per_token_logps(model, ids, attn, T)  # (4, T)


def test_wrap_counts_and_freezes(toy_model_dir):
    model = lora.wrap(base_model(toy_model_dir), lora_args())
    # 4 layers x 7 linear layers, r (d_in + d_out) each at r = 16, width 128, KV 64, MLP 384:
    # q, o 16 * 256 = 4,096; k, v 16 * 192 = 3,072; gate, up, down 16 * 512 = 8,192: 38,912 a layer,
    # 155,648 trainable of 790,784 + 155,648 = 946,432
    assert lora.trainable_counts(model) == (155_648, 946_432)
    assert len(lora.lora_layers(model)) == 28
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if ".lora_" in n)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {n for n, _ in model.named_parameters()
                                                                           if ".lora_" in n}
    # a bf16 base stays bf16 (frozen: no master copy needed), its adapter is fp32 for AdamW
    half = lora.wrap(base_model(toy_model_dir, torch.bfloat16), lora_args())
    dtypes = {(".lora_" in n, p.dtype) for n, p in half.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_step_moves_lora_weights_only(toy_model_dir, checkpointing):
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--model", "toy", "--use-peft", "--no-progress"]
                                            + ["--gradient-checkpointing"] * checkpointing), ap)
    model = base_model(toy_model_dir)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model = lora.wrap(model, args)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = run_setup.make_optimizer(model, args)
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == 155_648  # AdamW sees LoRA only
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    ids, attn, T = rows(toy_model_dir)
    batch = {"input_ids": ids, "attention_mask": attn, "completion_mask": torch.ones_like(ids[:, -T:]),
             "advantages": torch.tensor([1.0, -1.0, 1.0, -1.0])}  # every token counts (padding too: fine here)
    metrics = train.policy_update(model, optimizer, scheduler, batch, args)  # 2 mini-batches: 2 AdamW steps
    assert metrics["grad_norm"] > 0
    # exact: whether a tensor was written at all
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    # step 1 moves every B (A's gradient is 0 while B = 0); step 2 then moves A too
    assert changed == {n for n in before if ".lora_" in n}, sorted(set(before) ^ changed)[:4]


def test_reference_is_the_base_model_up_to_rounding(toy_model_dir):
    """The reference is the base model, to within float rounding, not bit for bit: the two are not
    the same sequence of kernels. The base model's weights are trainable and the wrapped model's are
    frozen, and on the output layer (input a logits_to_keep slice, not contiguous) torch's linear then
    takes two routes to the matrix library (measured on an Intel Xeon: 1.7e-5 apart on one logit,
    up to 3.8e-6 on a log-prob, with any thread count or ATEN_CPU_CAPABILITY; equal on AMD EPYC).
    ROUNDING is 25x the worst of those and 100x below what the adapter moves (> 1e-2), so an adapter
    left on, or the wrong base weights, still fail here."""
    batch = rows(toy_model_dir)
    base = logps(base_model(toy_model_dir), batch)
    policy_model = moved_adapter(lora.wrap(base_model(toy_model_dir), lora_args(lora_dropout=0.0)))
    policy = logps(policy_model, batch)
    reference = logps(lora.WithoutAdapter(policy_model), batch)
    torch.testing.assert_close(reference, base, rtol=0, atol=ROUNDING)  # the base, up to rounding
    assert (policy - base).abs().max() > 100 * ROUNDING  # the adapter does move the policy ...
    assert (reference - policy).abs().max() > 100 * ROUNDING  # ... and the reference has it off
    # exact: the same model and the same call twice (the adapter is on again after the reference)
    assert torch.equal(logps(policy_model, batch), policy)


def test_train_beta_uses_the_adapterless_policy_as_reference(toy_model_dir, tmp_path, monkeypatch):
    loads = []
    real = run_setup.load_model_and_tokenizer
    monkeypatch.setattr(run_setup, "load_model_and_tokenizer", lambda *a, **k: loads.append(1) or real(*a, **k))
    seen = {}
    real_update = train.policy_update

    def spy(model, optimizer, scheduler, batch, args, ref_model=None, **kw):
        seen["ref"] = ref_model
        return real_update(model, optimizer, scheduler, batch, args, ref_model, **kw)

    monkeypatch.setattr(train, "policy_update", spy)
    # one optimizer step per RL step, so step 1's KL is measured before any update
    train.main(SMALL + ["--use-peft", "--beta", "0.04", "--steps", "3", "--num-mini-batches", "1",
                        "--output-dir", str(tmp_path)])
    assert len(loads) == 1  # one model: no reference copy
    assert isinstance(seen["ref"], lora.WithoutAdapter)
    steps = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    kls = [r["kl"] for r in steps if r["type"] == "train"]
    assert abs(kls[0]) < 1e-6 and all(k > -1e-6 for k in kls) and kls[-1] > 1e-4  # B = 0: policy = base until the first update, up to rounding (the reference is a second forward pass; float32 k3 ~1e-7; steps 2-3: ~1e-2)


@pytest.fixture
def fake_vllm(monkeypatch):
    import sys

    fake = FakeVLLM([])
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", fake.platforms)
    return fake


def engine(toy_model_dir):
    args = types.SimpleNamespace(vllm_enable_sleep_mode=False, vllm_gpu_memory_utilization=0.3, seed=0,
                                 max_completion_length=8)
    return rollout.VLLMGenerator(args, str(toy_model_dir))


def test_engine_receives_w_plus_delta_under_base_names(fake_vllm, toy_model_dir):
    policy_model = moved_adapter(lora.wrap(base_model(toy_model_dir), lora_args()))
    policy_model.eval()  # dropout off: the policy's log-probs as the sampler sees them
    engine(toy_model_dir)._push_weights(policy_model)
    plain = base_model(toy_model_dir)
    # names and shapes a full model pushes (named_parameters: the tied lm_head once, as embed_tokens)
    assert [(n, s) for n, s, _ in fake_vllm.loaded] == [(n, tuple(p.shape)) for n, p in plain.named_parameters()]
    batch = rows(toy_model_dir)
    base = logps(plain, batch)
    plain.load_state_dict({n: t for n, _, t in fake_vllm.loaded}, strict=False)  # lm_head re-tied to embed_tokens
    received, policy = logps(plain, batch), logps(policy_model, batch)
    print(f"max |log-prob gap|: received vs policy {(received - policy).abs().max():.2e}, "
          f"base vs policy {(base - policy).abs().max():.2e}")
    assert (received - policy).abs().max() < ASSOCIATION
    assert (base - policy).abs().max() > 1e-2  # a push of W alone would be this far off


def test_base_stays_bit_identical_after_many_pushes_where_merge_unmerge_drifts(fake_vllm, toy_model_dir):
    policy_model = moved_adapter(lora.wrap(base_model(toy_model_dir, torch.bfloat16), lora_args()))
    base_before = {n: p.detach().clone() for n, p in policy_model.named_parameters() if ".lora_" not in n}
    gen = engine(toy_model_dir)
    for _ in range(50):
        gen._push_weights(policy_model)
    # exact: whether a tensor was written at all
    assert all(torch.equal(p, base_before[n]) for n, p in policy_model.named_parameters() if ".lora_" not in n)
    assert all(t.dtype == torch.float32 for n, _, t in fake_vllm.loaded if n.endswith("_proj.weight"))  # W + delta: fp32
    # What lora.engine_weights avoids: peft's merge (W += s B A in bf16) then unmerge (W -= s B A) 10 times
    drift = copy.deepcopy(policy_model)
    for _ in range(10):
        for layer in lora.lora_layers(drift).values():
            layer.merge()
            layer.unmerge()
    changed = sum(int((p != base_before[n]).sum()) for n, p in drift.named_parameters() if ".lora_" not in n)
    print(f"merge/unmerge x10 changed {changed} bf16 base values")
    assert changed > 0


def test_resume_is_exact_and_the_final_merged_model_loads_without_peft(toy_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    flags = SMALL + ["--use-peft", "--save-every", "2"]
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    train.main(flags + ["--steps", "4", "--output-dir", str(ref_dir)])
    train.main(flags + ["--steps", "2", "--output-dir", str(cut_dir)])
    train.main(flags + ["--steps", "4", "--output-dir", str(cut_dir), "--resume"])
    keep = ("budgets", "prompt_idx", "reward", "loss", "grad_norm", "kl", "ratio_mean")

    def steps(out):
        return [{k: r[k] for k in keep} for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
                if r["type"] == "train"]

    assert steps(ref_dir) == steps(cut_dir) and len(steps(ref_dir)) == 4
    ref, cut = (load_file(d / "checkpoint-4" / lora.ADAPTER_FILE) for d in (ref_dir, cut_dir))
    # exact: the same computation: a resumed run takes the same ops as a straight one
    assert ref.keys() == cut.keys() and all(torch.equal(ref[k], cut[k]) for k in ref)  # bit for bit
    state = [torch.load(d / "checkpoint-4" / "trainer_state.pt", weights_only=False) for d in (ref_dir, cut_dir)]
    moments = [[s["exp_avg"] for s in st["optimizer"]["state"].values()] for st in state]
    # exact: the same computation: a resumed run takes the same ops as a straight one
    assert len(moments[0]) == 56 and all(torch.equal(a, b) for a, b in zip(*moments))  # AdamW: LoRA's 56 only

    # merged/: plain transformers, no peft; its log-probs are the trained policy's
    merged = AutoModelForCausalLM.from_pretrained(ref_dir / "checkpoint-4" / "merged")
    assert not lora.is_lora(merged)
    policy_model = lora.wrap(base_model(toy_model_dir), lora_args())
    lora.load_adapter(policy_model, lora.read_adapter(ref_dir / "checkpoint-4"))
    policy_model.eval()
    batch = rows(toy_model_dir)
    assert (logps(merged, batch) - logps(policy_model, batch)).abs().max() < ASSOCIATION
    assert (logps(base_model(toy_model_dir), batch) - logps(policy_model, batch)).abs().max() > 1e-4  # it trained
    assert not (ref_dir / "checkpoint-2" / "merged").exists()  # only the run's end gets one


def test_resume_refuses_another_adapter_shape(toy_model_dir, tmp_path):
    model = lora.wrap(base_model(toy_model_dir), lora_args(lora_r=8))
    model.save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match="adapter does not fit"):
        lora.load_adapter(lora.wrap(base_model(toy_model_dir), lora_args()), lora.read_adapter(tmp_path))


def test_train_py_use_peft_20_steps_on_the_toy(toy_model_dir, tmp_path):
    summary = train.main(["--model", "toy", "--use-peft", "--steps", "20", "--prompts-per-step", "8", "--eval-size", "64",
                          "--no-progress", "--output-dir", str(tmp_path)])
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log[0]["use_peft"] and log[0]["learning_rate"] == pytest.approx(2e-3)  # 10x the toy's 2e-4 (cli.LORA_LR_FACTOR): a float product
    assert len([r for r in log if r["type"] == "train"]) == 20 and summary["type"] == "summary"
    assert {p.name for p in (tmp_path / "checkpoint-20").iterdir()} >= {"adapter_config.json",
                                                                         "adapter_model.safetensors", "merged"}


def test_gpu_check_tiny_use_peft(tmp_path):
    import gpu_check

    assert gpu_check.main(["--tiny", "--use-peft", "--out", str(tmp_path)]) == 0


def test_lora_flags_defaults_and_one_line_errors(toy_model_dir, tmp_path, capsys):
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--use-peft", "--model", "Qwen2.5-1.5B"]), ap)
    assert (args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_target_modules) == (16, 32, 0.05, ["all-linear"])  # exact: argparse defaults: copies
    assert args.learning_rate == pytest.approx(1e-5)  # hub preset 1e-6 x 10
    assert train.resolve_args(ap.parse_args(["--use-peft", "--learning-rate", "3e-6"]), ap).learning_rate == 3e-6  # exact: parsed from the flag: a copy
    assert train.resolve_args(ap.parse_args(["--model", "toy"]), ap).learning_rate == 2e-4  # exact: the toy's default, copied; without LoRA: unchanged
    for bad, needle in ((["--lora-r", "0"], "--lora-r must be in"), (["--lora-dropout", "1"], "--lora-dropout must be in"),
                        (["--eval-only", "--use-peft"], "drop --use-peft")):
        with pytest.raises(SystemExit):
            train.main(bad + ["--output-dir", str(tmp_path)])
        assert needle in capsys.readouterr().err
    with pytest.raises(SystemExit, match="error: --lora-target-modules no_such_proj: .*all-linear"):
        lora.wrap(base_model(toy_model_dir), lora_args(lora_target_modules=["no_such_proj"]))


@pytest.mark.filterwarnings("error:Model has .tie_word_embeddings=True.")  # peft's warning: silenced, we refuse
def test_a_tied_output_layer_is_refused_as_a_target_and_an_untied_one_is_pushed(toy_model_dir, tmp_path):
    """Issue 41.3: the toy's lm_head is tied to embed_tokens. Wrapped, its update moves the policy's logits
    but named_parameters lists the tied weight once, as embed_tokens, so vLLM and merged/ would get W
    alone: one line refuses it, before any step. Untied, lm_head's W + s * B A reaches the engine."""
    with pytest.raises(SystemExit, match=r"^error: --lora-target-modules lm_head q_proj: lm_head shares its weight "
                                         r"with the input embedding .*drop lm_head from --lora-target-modules"):
        lora.wrap(base_model(toy_model_dir), lora_args(lora_target_modules=["lm_head", "q_proj"]))
    with pytest.raises(SystemExit) as e:  # the same line from the command line, before the first step
        train.main(SMALL + ["--use-peft", "--lora-target-modules", "lm_head", "q_proj", "--steps", "1",
                            "--output-dir", str(tmp_path)])
    assert str(e.value).startswith("error: --lora-target-modules lm_head q_proj: lm_head shares") and "\n" not in str(e.value)
    assert not (tmp_path / "log.jsonl").exists() and not list(tmp_path.glob("checkpoint-*"))  # nothing trained
    # untied (its own copy of the weight): allowed, and the engine receives lm_head's W + s * B A
    untied = base_model(toy_model_dir)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    untied.config.tie_word_embeddings = False
    policy_model = moved_adapter(lora.wrap(untied, lora_args(lora_target_modules=["lm_head", "q_proj"], lora_dropout=0.0)))
    pushed = dict(lora.engine_weights(policy_model))
    layer = lora.lora_layers(policy_model)["lm_head"]
    torch.testing.assert_close(pushed["lm_head.weight"], layer.base_layer.weight.float() + lora.lora_delta(layer))
    assert (pushed["lm_head.weight"] - pushed["model.embed_tokens.weight"]).abs().max() > 1e-3


def test_merged_model_is_written_where_the_run_really_ends(toy_model_dir, tmp_path):
    """Issue 41.4: a run that ends on --max-rollouts before --steps (as compare.py runs DAPO's arm) gets
    merged/ in its last checkpoint, as one that reaches --steps does."""
    # B_total = 8 x 4 = 32 a step: 64 rollouts end the run after step 2 of 4
    summary = train.main(SMALL + ["--use-peft", "--steps", "4", "--max-rollouts", "64", "--save-every", "1",
                                  "--output-dir", str(tmp_path)])
    assert summary["step"] == 2 and summary["rollouts"] == 64
    assert (tmp_path / "checkpoint-2" / "merged" / "model.safetensors").is_file()
    assert not (tmp_path / "checkpoint-1" / "merged").exists()  # not an end: no merged model


def test_no_grad_forwards_run_in_eval_mode_and_the_update_in_train_mode(toy_model_dir, tmp_path, monkeypatch):
    """With LoRA's dropout (0.05) the mode matters: generation (which records the sampler's log-probs),
    the old policy's and the reference's log-probs and the evaluation must run without dropout (eval
    mode), the loss's forwards with it (train mode). A hook records the mode of every forward of a
    2-step run whose old log-probs come from a no-grad forward (--no-sampler-logps) and with a KL term."""
    modes = []
    real = run_setup.load_model_and_tokenizer

    def load(*a, **k):
        model, tok, path = real(*a, **k)
        model.register_forward_pre_hook(lambda m, _: modes.append((torch.is_grad_enabled(), m.training)))
        return model, tok, path

    monkeypatch.setattr(run_setup, "load_model_and_tokenizer", load)
    spans = []
    real_update = train.policy_update

    def update(*a, **k):  # which forwards belong to the update (the rest: generation and evaluation)
        start = len(modes)
        out = real_update(*a, **k)
        spans.append((start, len(modes)))
        return out

    monkeypatch.setattr(train, "policy_update", update)
    train.main(SMALL + ["--use-peft", "--steps", "2", "--num-mini-batches", "2", "--no-sampler-logps", "--beta", "0.04",
                        "--output-dir", str(tmp_path)])
    assert len(spans) == 2
    inside = [modes[i] for s, e in spans for i in range(s, e)]
    outside = [m for i, m in enumerate(modes) if not any(s <= i < e for s, e in spans)]
    assert inside.count((False, False)) >= 4 and inside.count((True, True)) >= 4  # pi_old and pi_ref; the loss
    assert set(inside) == {(False, False), (True, True)}, set(inside)  # no-grad: eval mode; with grad: train mode
    assert outside and set(outside) == {(False, False)}  # generation and evaluation: no grad, eval mode

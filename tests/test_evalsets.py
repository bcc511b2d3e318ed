"""The paper's Table 1 benchmarks by name (--eval-datasets), avg@k the paper's way, and --eval-only.
Run: python -m pytest -q tests/test_evalsets.py

Offline: `datasets.load_dataset` is replaced by a stand-in that returns the hand-written rows below,
each in the column layout its hub copy's loader returns (data.BENCHMARKS' comment gives the source
of each layout). Nothing is downloaded. Then: the alias loads the right (hub, config, split), the
answers are normalised, and verify.py gives 1 to a right final answer and 0 to a wrong one in each
benchmark's answer format. --eval-only runs on the toy model and on a toy checkpoint directory.
"""
import json
from pathlib import Path

import datasets
import pytest

from harness import data
from harness import evaluate
import train
from harness import run as run_setup
import verify

# A few rows per benchmark, in its hub copy's exact columns (contents written for the test).
FIXTURES = {
    "aime24": [  # HuggingFaceH4/aime_2024, split train: id, problem, solution, answer (string), url, year
        {"id": 60, "problem": "Find the remainder when 2^{10} + 7 is divided by 1000.",
         "solution": "2^{10} + 7 = 1031, so the remainder is $\\boxed{031}$.", "answer": "031",
         "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1", "year": "2024"},
        {"id": 61, "problem": "How many positive divisors does 2024 have?",
         "solution": "2024 = 2^3 * 11 * 23 has 4 * 2 * 2 = 16 divisors.", "answer": "16",
         "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_2", "year": "2024"},
    ],
    "aime25": [  # math-ai/aime25, split test: problem, answer (string), id (string)
        {"problem": "Find the sum of all integer bases b > 9 for which 17_b divides 97_b.", "answer": "70",
         "id": "0"},
        {"problem": "What is 3 + 4 written with three digits?", "answer": "007", "id": "1"},
    ],
    "amc23": [  # math-ai/amc23, split test: id, question, answer (a number on the hub), url
        {"id": 0, "question": "Cities A and B are 45 miles apart. How many miles from A do they meet?",
         "answer": 27.0, "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1"},
        {"id": 1, "question": "What is 1/2 + 1/4?", "answer": 0.75,
         "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_2"},
    ],
    "math500": [  # HuggingFaceH4/MATH-500, split test: problem, solution, answer, subject, level, unique_id
        {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
         "solution": "We have $r = 3$ and $\\theta = \\frac{\\pi}{2}$, so $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
         "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
         "unique_id": "test/precalculus/807.json"},
        {"problem": "Simplify $\\frac{28}{6}$.", "solution": "$\\frac{28}{6} = \\boxed{\\frac{14}{3}}$.",
         "answer": "\\frac{14}{3}", "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    ],
    "minerva": [  # math-ai/minervamath, split test: question, answer
        {"question": "Each of the two Magellan telescopes has a diameter of 6.5 m. What is the area of one "
                     "mirror in m^2, to 1 decimal place?", "answer": "33.2"},
        {"question": "Preamble: a solution of the form $x(t) = A e^{-t}$. Find the answer.",
         "answer": "The solution is $\\boxed{\\frac{1}{2}}$."},
    ],
    "olympiadbench": [  # Hothan/OlympiadBench, config OE_TO_maths_en_COMP, split train
        {"id": 1606, "question": "Compute the number of positive integers n <= 10 with n^2 + 1 prime.",
         "solution": ["Check n = 1, 2, 4, 6, 10: $\\boxed{5}$."], "final_answer": ["$5$"], "context": None,
         "image_1": None, "image_2": None, "image_3": None, "image_4": None, "image_5": None,
         "modality": "Text-only", "difficulty": "Competition", "is_multiple_answer": False, "unit": None,
         "answer_type": "Numerical", "error": None, "question_type": "Open-ended", "subfield": "Number Theory",
         "subject": "Math", "language": "English"},
        {"id": 1607, "question": "Find all real x with x^2 = 4.",
         "solution": ["x = 2 or x = -2."], "final_answer": ["$2$", "$-2$"],
         "context": "Answer with both roots.", "image_1": None, "image_2": None, "image_3": None,
         "image_4": None, "image_5": None, "modality": "Text-only", "difficulty": "Competition",
         "is_multiple_answer": True, "unit": None, "answer_type": "Numerical", "error": None,
         "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"},
    ],
}

# (benchmark, row, reference answer after normalisation, a right completion, a wrong completion)
CASES = [
    ("aime24", 0, "31", "... so the remainder is \\boxed{31}.", "... so the remainder is \\boxed{131}."),
    ("aime24", 1, "16", "The count is \\boxed{016}.", "The count is \\boxed{8}."),
    ("aime25", 0, "70", "Thus the sum is \\boxed{70}.", "Thus the sum is \\boxed{49}."),
    ("aime25", 1, "7", "\\boxed{7}", "\\boxed{70}"),
    ("amc23", 0, "27", "They meet \\boxed{27} miles from A.", "They meet \\boxed{18} miles from A."),
    ("amc23", 1, "0.75", "\\boxed{\\frac{3}{4}}", "\\boxed{\\frac{1}{4}}"),
    ("math500", 0, "\\left( 3, \\frac{\\pi}{2} \\right)", "So \\boxed{\\left(3, \\frac{\\pi}{2}\\right)}.",
     "So \\boxed{\\left(3, \\pi\\right)}."),
    ("math500", 1, "\\frac{14}{3}", "\\boxed{\\frac{28}{6}}", "\\boxed{\\frac{14}{6}}"),
    ("minerva", 0, "33.2", "The area is \\boxed{33.2}.", "The area is \\boxed{42.3}."),
    ("minerva", 1, "\\frac{1}{2}", "\\boxed{0.5}", "\\boxed{2}"),
    ("olympiadbench", 0, "5", "There are \\boxed{5} such n.", "There are \\boxed{4} such n."),
    ("olympiadbench", 1, "2, -2", "\\boxed{2, -2}", "\\boxed{2}"),
]


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset -> the FIXTURES rows of the benchmark whose (hub, config, split) is asked
    for, as a datasets.Dataset (what load_dataset(..., split=...) returns); records every call."""
    calls = []
    by_source = {(hub, config, split): name for name, (hub, config, split, *_rest) in data.BENCHMARKS.items()}

    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(FIXTURES[by_source[(path, name, split)]])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_every_alias_has_a_fixture():
    assert set(FIXTURES) == set(data.BENCHMARKS) == {"aime24", "aime25", "amc23", "math500", "minerva",
                                                     "olympiadbench"}
    assert data.resolve_benchmarks(["paper"]) == list(data.BENCHMARKS)
    assert data.resolve_benchmarks(["math500", "paper", "aime24"])[:2] == ["math500", "aime24"]  # no repeats
    with pytest.raises(SystemExit, match=r"--eval-datasets aime2024: unknown benchmark: pass one of aime24, "):
        data.resolve_benchmarks(["aime2024"])


@pytest.mark.parametrize("name", list(FIXTURES))
def test_alias_reads_its_hub_copy(fake_hub, name):
    """The alias asks for its (hub, config, split) and turns the rows into question/answer records."""
    records = data.load_benchmark(name)
    hub, config, split, *_ = data.BENCHMARKS[name]
    assert fake_hub == [(hub, config, split)]
    assert len(records) == len(FIXTURES[name])
    for record, row in zip(records, FIXTURES[name]):
        question = row.get("question", row.get("problem"))
        assert record["question"].endswith(question)
    if name == "olympiadbench":  # the shared context goes before the question
        assert records[1]["question"] == "Answer with both roots.\nFind all real x with x^2 = 4."


@pytest.mark.parametrize("name, row, reference, right, wrong", CASES)
def test_answers_normalised_and_verified(fake_hub, name, row, reference, right, wrong):
    """Each format's reference answer becomes what verify.py compares, and the reward is 1 for a right
    final answer (also written another way: "016", 3/4, 28/6, 0.5) and 0 for a wrong one."""
    record = data.load_benchmark(name)[row]
    assert record["answer"] == reference
    # the hub preset's verifier: \boxed{} answers, no last-number fallback
    assert verify.rewards([right, wrong], [record["answer"]] * 2, last_number_fallback=False) == [1.0, 0.0]  # exact: 0/1 rewards


def test_answer_normalisation_edge_cases():
    assert data.benchmark_answer("023") == "23" and data.benchmark_answer("-05") == "-5"
    assert data.benchmark_answer(27.0) == "27" and data.benchmark_answer(2.5) == "2.5"
    assert data.benchmark_answer(["$2$", "$3$"]) == "2, 3" and data.benchmark_answer("$2$, $3$") == "2, 3"
    assert data.benchmark_answer("costs \\$5") == "costs \\$5"  # an escaped dollar is a dollar
    for empty in (None, "", "  ", [], ["$3$", None], float("nan"), True):
        assert data.benchmark_answer(empty) is None


def test_a_row_without_an_answer_is_skipped_and_counted(monkeypatch):
    rows = FIXTURES["aime25"] + [{"problem": "No answer here.", "answer": None, "id": "2"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: datasets.Dataset.from_list(rows))
    counts = {}
    assert len(data.load_benchmark("aime25", counts=counts)) == 2 and counts["skipped_rows"] == 1
    with pytest.raises(SystemExit, match=r"aime25 \(math-ai/aime25\) row 3: no usable 'answer'"):
        data.load_benchmark("aime25", bad_rows="error")


def test_offline_hub_name_is_a_one_line_hint(monkeypatch):
    def offline(*a, **kw):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/aime_2024' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SystemExit, match=r"^error: cannot load benchmark 'aime24' \(HuggingFaceH4/aime_2024\) "
                                         r"from the hub \(ConnectionError\): when offline, pass a local "
                                         r".jsonl file with --eval-files PATH$"):
        data.load_benchmark("aime24")


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


TOY = ["--model", "toy", "--no-progress", "--eval-samples", "2"]


def test_eval_only_on_the_toy_with_benchmarks(tmp_path, toy_model_dir, fake_hub, capsys):
    """--eval-only: no training, no checkpoint; one config line and one eval record with each set's
    avg@k, its standard error, pass@k and greedy accuracy, and the mean over the benchmarks."""
    out = tmp_path / "ev"
    record = train.main(TOY + ["--eval-only", "--eval-size", "16", "--eval-datasets", "aime24", "amc23",
                               "--output-dir", str(out)])
    log = read_log(out)
    assert [r["type"] for r in log] == ["config", "eval"] and log[1] == record
    assert log[0]["eval_only"] is True and log[0]["eval_samples"] == 2
    assert record["eval_only"] and record["problems"] == {"heldout": 16, "aime24": 2, "amc23": 2}
    for name, n in record["problems"].items():
        assert 0 <= record[f"{name}_avg@2"] <= record[f"{name}_pass@2"] <= 1
        assert record[f"{name}_avg@2"] * n * 2 == round(record[f"{name}_avg@2"] * n * 2)  # n problems x 2
        assert record[f"{name}_avg@2_se"] >= 0 and 0 <= record[f"{name}_acc"] <= 1
    assert record["eval_mean_avg@2"] == pytest.approx((record["aime24_avg@2"] + record["amc23_avg@2"]) / 2)
    assert record["eval_seconds"] >= 0 and record["rollouts"] == 0
    assert not [p for p in out.iterdir() if p.name.startswith("checkpoint")]
    table = capsys.readouterr().out
    assert "avg@2" in table and "aime24" in table and "eval_mean_avg@2" in table
    # the directory now holds a log: a second --eval-only there needs --overwrite, like a run
    with pytest.raises(SystemExit, match="already holds a run"):
        train.main(TOY + ["--eval-only", "--eval-size", "16", "--output-dir", str(out)])
    with pytest.raises(SystemExit):
        train.main(TOY + ["--eval-only", "--resume", "--output-dir", str(out)])
    assert "nothing to --resume" in capsys.readouterr().err


def test_eval_only_reads_a_checkpoint_directory(tmp_path, toy_model_dir):
    """--model CHECKPOINT_DIR: the weights a run saved are the ones evaluated (greedy accuracy equals
    the run's own final evaluation of the same problems), with the toy's preset kept."""
    run = tmp_path / "run"
    small = TOY + ["--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
                   "--max-budget", "12", "--steps", "1", "--eval-every", "0", "--learning-rate", "1e-3"]
    summary = train.main(small + ["--output-dir", str(run)])
    ckpt = run / "checkpoint-1"
    args = train.resolve_args(train.build_parser().parse_args(["--model", str(ckpt), "--eval-only"]),
                              train.build_parser())
    assert (args.prompt_template, args.max_completion_length, args.eval_samples) == ("{question}", 8, 8)
    record = train.main(TOY + ["--eval-only", "--model", str(ckpt), "--eval-size", "16", "--train-size", "32",
                               "--output-dir", str(tmp_path / "ev")])
    assert read_log(tmp_path / "ev")[0]["model_path"] == str(ckpt)
    assert record["heldout_acc"] == summary["heldout_acc_end"]


def test_training_and_eval_only_choose_device_and_autocast_alike():
    """models.device_and_amp, which train.setup and --eval-only both call: on CPU the default is fp32
    forwards (no autocast); --bf16 gives a context under which a matmul of fp32 tensors comes out bf16."""
    import argparse

    import torch

    from harness.models import device_and_amp
    device, bf16, amp = device_and_amp(argparse.Namespace(device="cpu", bf16=None))
    with amp():
        plain = torch.ones(2, 3) @ torch.ones(3, 2)
    assert (device.type, bf16, plain.dtype) == ("cpu", False, torch.float32)
    device, bf16, amp = device_and_amp(argparse.Namespace(device="cpu", bf16=True))
    with amp():
        mixed = torch.ones(2, 3) @ torch.ones(3, 2)
    assert bf16 and mixed.dtype == torch.bfloat16 and (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float32


def test_one_default_device_for_training_bf16_and_process_group(monkeypatch):
    """models.default_device holds the "--device, else CUDA when there is one" default that
    cli.resolve_args (the recorded --bf16), device_and_amp (the training device) and train.main
    (dist.init's device) all use: with CUDA present and no --device the first two say cuda (bf16 on),
    without it cpu (bf16 off); an explicit --device wins."""
    import argparse

    import torch

    from harness.models import default_device, device_and_amp
    assert default_device("cpu") == "cpu" and default_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device(None) == "cuda"
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(TOY), ap)  # no --device, no --bf16
    assert args.device is None and args.bf16 is True  # resolved for the CUDA the run will use
    assert device_and_amp(argparse.Namespace(device=None, bf16=None))[:2] == (torch.device("cuda"), True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device(None) == "cpu" and train.resolve_args(ap.parse_args(TOY), ap).bf16 is False


def test_run_eval_means_over_benchmarks_not_heldout(monkeypatch):
    """eval_mean_avg@k is the plain mean over the benchmark sets (Table 1's Avg.); the held-out split
    is not a benchmark and stays out of it."""
    fixed = {"heldout": 0.9, "aime24": 0.1, "math500": 0.4}
    monkeypatch.setattr(evaluate, "evaluate", lambda model, tok, records, args, gen: {
        "acc": fixed[records[0]["name"]], "avg@4": fixed[records[0]["name"]] / 2})
    written = []
    run = run_setup.Run(run_setup.argparse.Namespace(eval_samples=4, seed=0), None, None, None, None, None, None, None, None,
                    None, [], {name: [{"name": name}] for name in fixed}, None, train.contextlib.nullcontext,
                    counters={"rollouts": 7, "seconds": 0.0})
    run.write = written.append
    record = evaluate.run_eval(run, 3)
    assert written == [record] and record["step"] == 3 and record["rollouts"] == 7
    assert record["eval_mean_avg@4"] == pytest.approx((0.05 + 0.2) / 2)
    assert record["heldout_avg@4"] == pytest.approx(0.45) and "eval_mean_acc" not in record


def test_presets_evaluate_the_papers_way():
    """avg@k is on by default: k = 8 on the labs (the default toy-reason: 512 held-out problems at
    steps 0, 20, 40; toy: 1,024 every 75 steps, README's cost measurements), k = 16 on real models
    (the paper's avg@16); --eval-samples 0 turns it off."""
    ap = train.build_parser()
    default = train.resolve_args(ap.parse_args([]), ap)
    assert default.model == "toy-reason" and not default.last_number_fallback
    assert (default.eval_samples, default.eval_size, default.eval_every, default.steps) == (8, 512, 20, 40)
    toy = train.resolve_args(ap.parse_args(["--model", "toy"]), ap)
    assert (toy.eval_samples, toy.eval_size, toy.eval_every, toy.steps) == (8, 1024, 75, 150)
    hub = train.resolve_args(ap.parse_args(["--model", "Qwen2.5-1.5B", "--eval-datasets", "paper"]), ap)
    assert hub.eval_samples == 16 and hub.eval_datasets == ["paper"]
    assert train.resolve_args(ap.parse_args(["--eval-samples", "0"]), ap).eval_samples == 0

"""Data: what turns `--dataset` into the problems train.py samples from, as {'question', 'answer'} records.

The paper trains on MATH-style problems with a verifiable final answer (§3, App. C): a prompt is a
question, a reward is 1 when the completion's final answer matches the reference (verify.py).
This file reads them from the toy generator (toy.py), a hub dataset (aliases below), one of the
paper's Table 1 benchmarks by name (BENCHMARKS, for --eval-datasets) or a local .jsonl/.json/.parquet
file; checks every row (a row without a usable question or answer is skipped and counted, or with
--bad-rows error stops the run at its file:line); keeps only the final answer of a GSM8K/MATH
solution (and normalises the benchmarks' answers); formats prompts (template, chat template); and
skips problems whose prompt is over --max-prompt-length tokens; and the order in which the
training loop draws them (PromptSampler: seeded epochs over the pool; MoPPSSampler: MoPPS's Thompson-
sampled choice among them, --prompt-selection mopps, docs/arms.md). It keeps file formats and their errors out of train.py,
whose loop only sees records. No model, no torch.
Tests: tests/test_reliability.py (bad data files), tests/test_train.py (answers, splits),
tests/test_arms_dapo_mopps.py (MoPPS), tests/test_evalsets.py (the benchmarks: columns, answer normalisation, rewards; offline).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sys
from pathlib import Path

import numpy as np

import toy
from harness import arith
import verify

# name -> (hub path, config name, question field, answer field, train split, test split)
DATASET_ALIASES = {
    "gsm8k": ("openai/gsm8k", "main", "question", "answer", "train", "test"),
    "math": ("DigitalLearningGmbH/MATH-lighteval", None, "problem", "solution", "train", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "problem", "answer", "test", None),
    "dapo-math-17k": ("BytedTsinghua-SIA/DAPO-Math-17k", None, "prompt", "reward_model.ground_truth",
                      "train", None),
}
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# The held-out slice of a file without a test split is drawn with this seed, not --seed: runs of
# different seeds are then evaluated on the same problems (paired comparisons), as the toy's split
# (toy seed 0) always was. --seed still orders the training.
SPLIT_SEED = 0

# The paper's Table 1 benchmarks (§3; docs/method-sources.md §5: avg@16 at T = 1.0, top-p 0.9), by name
# (`--eval-datasets aime24 math500 ...`, or `paper` for all six). Each maps to one public hub copy,
# read with datasets.load_dataset(hub, config, split=split); `question` and `answer` are its columns
# as the hub loader returns them (the dataset card's features; the same columns the loaders of verl
# recipes, lighteval and evalscope read). Why these copies:
# - aime24: HuggingFaceH4/aime_2024, split 'train' (its only split), 30 problems; 'answer' is a string
#   of the integer ("204"; AIME answers are 000-999, so "023" and "23" must compare equal).
# - aime25: math-ai/aime25, split 'test', 30 problems in one config ('problem', string 'answer').
#   Not opencompass/AIME2025: it splits the year into two configs (AIME2025-I/-II, 15 each).
# - amc23: math-ai/amc23, split 'test', the 40 AMC 2023 problems ('question', 'answer'); loaders
#   cast the answer with str()/int(), so it may come back as a number (27.0): normalised to "27".
#   Not AI-MO/aimo-validation-amc: it holds 83 problems of AMC 2022 and 2023 (filter by url needed).
# - math500: HuggingFaceH4/MATH-500, split 'test', 500 problems; 'answer' is the final answer
#   already cut out of the MATH solution (LaTeX: "\frac{14}{3}", "\left( 3, \frac{\pi}{2} \right)").
# - minerva: math-ai/minervamath, split 'test', 272 problems ('question', 'answer': a final answer;
#   a \boxed{} solution is cut to its box like MATH's).
# - olympiadbench: Hothan/OlympiadBench (the benchmark authors' own upload), config
#   'OE_TO_maths_en_COMP' (open-ended, text-only, maths, English, competition: the 675-problem subset
#   RL papers report), split 'train' (its only split); 'final_answer' is a list of LaTeX strings
#   (["$3$"], two items when is_multiple_answer): dollars stripped, items joined with ", ". A row's
#   'context' (shared set-up text, usually empty) goes before its question.
BENCHMARKS = {
    # name: (hub path, config, split, question column, answer column, problems)
    "aime24": ("HuggingFaceH4/aime_2024", None, "train", "problem", "answer", 30),
    "aime25": ("math-ai/aime25", None, "test", "problem", "answer", 30),
    "amc23": ("math-ai/amc23", None, "test", "question", "answer", 40),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem", "answer", 500),
    "minerva": ("math-ai/minervamath", None, "test", "question", "answer", 272),
    "olympiadbench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", "question", "final_answer", 675),
}


def _field(record: dict, dotted: str):
    """record['a']['b'] for 'a.b'; a chat-style list of messages yields its last message's content."""
    value = record
    for key in dotted.split("."):
        value = value[key]
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        value = value[-1]["content"]
    return value


_MISSING = object()  # a row without the field at all, told apart from a field that is null


def _field_or_missing(record, dotted: str):
    try:
        return _field(record, dotted)
    except (KeyError, TypeError, IndexError):  # no such key, a row that is not an object, empty list
        return _MISSING


def usable_text(value) -> str | None:
    """A question or answer as text, or None when nothing can be learnt from it: missing, null, empty,
    a list or an object (str(None) would otherwise turn a null into the question "None")."""
    if isinstance(value, bool) or value is None or value is _MISSING:
        return None
    if isinstance(value, (int, float)):  # numeric answers ("answer": 72) are fine
        return str(value) if math.isfinite(value) else None
    return value if isinstance(value, str) and value.strip() else None


def reference_answer(raw) -> str:
    """GSM8K answers end in '#### 42' and MATH solutions hold a \\boxed{}: keep only the final answer."""
    text = str(raw)
    if "\\boxed" in text or "####" in text:
        found, _rule = verify.extract_answer(text)
        if found is not None:
            return found
    return text.strip()


def benchmark_answer(raw) -> str | None:
    """A benchmark's reference answer as the text verify.py compares, or None when there is none.
    AIME's "023" -> "23" and AMC's 27.0 -> "27" (integers without padding or a decimal point),
    "$3$" -> "3", a \\boxed{} solution -> its box, an OlympiadBench list ["$2$", "$3$"] -> "2, 3"."""
    if isinstance(raw, (list, tuple)):
        parts = [benchmark_answer(x) for x in raw]
        return ", ".join(parts) if parts and None not in parts else None
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        if not math.isfinite(raw):
            return None
        return str(int(raw)) if float(raw).is_integer() else repr(float(raw))
    text = usable_text(raw)
    if text is None:
        return None
    text = text.strip()
    text = re.sub(r"(?<!\\)\$", "", text).strip()  # "$3$", "$2$, $3$": math-mode marks (a dollar is \$)
    text = reference_answer(text)
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))  # "023" -> "23"
    return text or None


def benchmark_rows(name: str, rows) -> list[dict]:
    """A benchmark's hub rows (BENCHMARKS' columns) -> {'question', 'answer'} rows for to_records;
    a value that is missing stays None, so to_records skips and counts the row."""
    _hub, _config, _split, qf, af, _n = BENCHMARKS[name]
    out = []
    for row in rows:
        question = usable_text(_field_or_missing(row, qf))
        context = usable_text(row.get("context")) if isinstance(row, dict) else None
        if question is not None and context is not None:  # OlympiadBench: the set-up shared by a group
            question = context.strip() + "\n" + question
        out.append({"question": question, "answer": benchmark_answer(_field_or_missing(row, af))})
    return out


def resolve_benchmarks(names: list[str]) -> list[str]:
    """--eval-datasets' names, 'paper' expanded to the six of Table 1; an unknown name is an error."""
    out = []
    for name in names:
        for n in (BENCHMARKS if name == "paper" else [name]):
            if n not in BENCHMARKS:
                raise SystemExit(f"error: --eval-datasets {n}: unknown benchmark: pass one of "
                                 f"{', '.join(BENCHMARKS)} or paper (all six), or a local file with --eval-files")
            if n not in out:
                out.append(n)
    return out


def load_benchmark(name: str, bad_rows: str = "skip", counts: dict | None = None) -> list[dict]:
    """One of BENCHMARKS from the hub as {'question', 'answer'} records (answers normalised)."""
    hub, config, split, _qf, _af, _n = BENCHMARKS[name]
    try:
        import datasets

        rows = datasets.load_dataset(hub, config, split=split)
    except Exception as e:  # offline, renamed, auth: all end the same way for a user
        raise SystemExit(f"error: cannot load benchmark '{name}' ({hub}) from the hub ({type(e).__name__}): "
                         "when offline, pass a local .jsonl file with --eval-files PATH")
    return to_records(benchmark_rows(name, rows), "question", "answer", f"{name} ({hub})", None, bad_rows, counts)


def to_records(rows, question_field: str, answer_field: str, source: str, where: list[str] | None = None,
               bad_rows: str = "skip", counts: dict | None = None) -> list[dict]:
    """Rows -> [{'question', 'answer'}] strings. Every row is checked, not just the first: a row
    without a usable question or answer is skipped and counted (counts['skipped_rows']), or with
    bad_rows='error' stops the run at its place (where[i], e.g. 'data.jsonl:17'). A field that no row
    has is a misnamed column: one error naming the columns and the flag to pass."""
    rows = list(rows)
    where = where or [f"{source} row {i + 1}" for i in range(len(rows))]
    pairs = [(_field_or_missing(r, question_field), _field_or_missing(r, answer_field)) for r in rows]
    for k, (name, flag) in enumerate(((question_field, "--question-field"), (answer_field, "--answer-field"))):
        if rows and all(pair[k] is _MISSING for pair in pairs):
            cols = ", ".join(sorted(rows[0])) if isinstance(rows[0], dict) else "?"
            raise SystemExit(f"error: {source} has no column '{name}' (columns: {cols}): pass {flag}")
    records, skipped = [], []
    for place, (q, a) in zip(where, pairs):
        question, answer = usable_text(q), usable_text(a)
        if question is None or answer is None:
            if bad_rows == "error":
                name = question_field if question is None else answer_field
                raise SystemExit(f"error: {place}: no usable '{name}' (missing, null or empty): fix the "
                                 "row, or pass --bad-rows skip to skip such rows")
            skipped.append(place)
            continue
        records.append({"question": question, "answer": reference_answer(answer)})
    if skipped:
        print(f"note: skipped {len(skipped)} of {len(rows)} rows without a usable question or answer "
              f"(first: {skipped[0]}); --bad-rows error stops at them instead", file=sys.stderr)
        if counts is not None:
            counts["skipped_rows"] = counts.get("skipped_rows", 0) + len(skipped)
    return records


def read_json_rows(path: Path, question_field: str) -> tuple[list, list[str]]:
    """(rows, where each came from) of a .jsonl/.json file: JSON Lines ('file:line'), a JSON array,
    an object holding one array of rows ({"data": [...]}), or one (pretty-printed) problem. A BOM is
    dropped; bytes that are not UTF-8 and lines that are not JSON are one-line errors with file:line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # -sig: a leading BOM (Windows editors) is not part of row 1
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SystemExit(f"error: {path}:{line}: byte 0x{data[e.start]:02x} is not UTF-8: save the file as UTF-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as e:
        whole = e  # JSON Lines (or broken): read line by line below
    if isinstance(whole, list):
        return whole, [f"{path} item {i + 1}" for i in range(len(whole))]
    if isinstance(whole, dict):
        arrays = [(k, v) for k, v in whole.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        if _field_or_missing(whole, question_field) is _MISSING and len(arrays) == 1:
            key, rows = arrays[0]
            return rows, [f"{path} {key}[{i}]" for i in range(len(rows))]
        return [whole], [f"{path}:1"]
    if not isinstance(whole, json.JSONDecodeError):
        raise SystemExit(f"error: {path}: holds a JSON {type(whole).__name__}, not problems (objects)")
    if text.lstrip().startswith("["):  # a broken array, not JSON Lines: its own error position is the useful one
        raise SystemExit(f"error: {path}:{whole.lineno}: not valid JSON ({whole.msg})")
    rows, where = [], []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {path}:{number}: not valid JSON ({e.msg}, column {e.colno})")
            where.append(f"{path}:{number}")
    return rows, where


def read_local(path: str, question_field: str, answer_field: str, bad_rows: str = "skip",
               counts: dict | None = None) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: dataset file {path} does not exist")
    if p.suffix == ".parquet":
        import datasets

        rows, where = datasets.load_dataset("parquet", data_files=str(p), split="train"), None
    elif p.suffix in (".jsonl", ".json"):
        rows, where = read_json_rows(p, question_field)
    else:
        raise SystemExit(f"error: {path}: use a .jsonl, .json or .parquet file")
    return to_records(rows, question_field, answer_field, path, where, bad_rows, counts)


def load_data(args, counts: dict | None = None, need_train: bool = True) -> tuple[list[dict], dict[str, list[dict]]]:
    """(train records, {eval name: records}); each record has 'question' and 'answer' strings.
    The eval sets: 'heldout' (unless --eval-size 0), each --eval-datasets benchmark, each --eval-files
    file (by its stem). counts (optional) collects the rows skipped on the way, for the log's config
    line. need_train=False (--eval-only): a training set too small to train on is no error."""
    rng = random.Random(SPLIT_SEED)
    held_out = 0
    eval_names = check_eval_names(args.eval_files)
    if arith.is_task(args):  # the real-LM lab's graded arithmetic (harness/arith.py)
        train, test = arith.make_splits(n_train=args.train_size, n_test=args.eval_size)
        evals = {"heldout": test}
    elif args.dataset == "toy":
        # Held-out split fixed by toy seed 0, independent of --seed, so seeds compare on the same test.
        # The task follows the lab: toy-reason's worked running sums, else the 8-level arithmetic.
        task = toy.task_of(toy.lab_name(args.model) or "toy")
        train, test = toy.task_splits(task, 0, n_train=args.train_size, n_test=args.eval_size)
        evals = {"heldout": test}
    else:
        hub, config, qf, af, train_split, test_split = DATASET_ALIASES.get(
            args.dataset, (args.dataset, None, "question", "answer", "train", None))
        qf, af = args.question_field or qf, args.answer_field or af
        if Path(args.dataset).suffix in (".jsonl", ".json", ".parquet"):
            train, test_split = read_local(args.dataset, qf, af, args.bad_rows, counts), None
        else:
            try:
                import datasets

                ds = datasets.load_dataset(hub, config)
            except Exception as e:  # offline, unknown name, auth: all end the same way for a user
                raise SystemExit(f"error: cannot load dataset '{args.dataset}' from the hub ({type(e).__name__}): "
                                 "when offline, pass a local .jsonl/.parquet file with --dataset PATH")
            train = to_records(ds[train_split], qf, af, args.dataset, None, args.bad_rows, counts)
            test_split = to_records(ds[test_split], qf, af, args.dataset, None, args.bad_rows, counts) \
                if test_split in ds else None
        if test_split is None:  # hold out a seeded slice of the training data
            rng.shuffle(train)
            # At most a fifth of the file: the hub preset's 500 would otherwise take all of a 40-problem file.
            held_out = min(args.eval_size, len(train) // 5)
            if held_out < args.eval_size:
                print(f"note: {args.dataset} has {len(train)} problems: holding out {held_out} (a fifth) for "
                      f"evaluation instead of --eval-size {args.eval_size}", file=sys.stderr)
            test_split, train = train[:held_out], train[held_out:]
        evals = {"heldout": test_split[:args.eval_size]}
    if args.eval_size == 0:  # asked for no held-out split (e.g. --eval-only on benchmarks): no note
        del evals["heldout"]
    for name in resolve_benchmarks(getattr(args, "eval_datasets", None) or []):
        evals[name] = load_benchmark(name, args.bad_rows, counts)
    for name, path in zip(eval_names, args.eval_files):
        if name in evals:
            raise SystemExit(f"error: --eval-files {path}: the eval set '{name}' is already loaded "
                             "(--eval-datasets): rename the file or drop one")
        evals[name] = read_local(path, args.question_field or "question",
                                 args.answer_field or "answer", args.bad_rows, counts)
    for name in [name for name, records in evals.items() if not records]:
        print(f"note: eval set '{name}' is empty: no accuracy is logged for it", file=sys.stderr)
        del evals[name]  # the mean of no problems is NaN, which would land in the log
    if need_train and len(train) < args.prompts_per_step:
        held = f" ({held_out} more held out by --eval-size)" if held_out else ""
        raise SystemExit(f"error: {len(train)} training problems{held} < --prompts-per-step "
                         f"{args.prompts_per_step}: lower --prompts-per-step or --eval-size, or add problems")
    return train, evals


def check_eval_names(paths: list[str]) -> list[str]:
    """Eval sets are named by file stem (their log keys: '<stem>_acc'): two files of one stem, or one
    named like the held-out split, would silently replace each other. One-line error instead."""
    names = {}
    for path in paths:
        stem = Path(path).stem
        if stem == "heldout":
            raise SystemExit(f"error: --eval-files {path} is named 'heldout', the name of the held-out split's "
                             "accuracy: rename the file")
        if stem in names:
            raise SystemExit(f"error: --eval-files {names[stem]} and {path} are both named '{stem}' (eval sets "
                             "are named by file stem): rename one, or pass each file once")
        names[stem] = path
    return list(names)


def check_prompt_template(template: str) -> None:
    """A template without {question} gives every problem one and the same prompt: refuse it."""
    if "{question}" not in template:
        raise SystemExit(f"error: --prompt-template {template!r} has no {{question}}: every problem would get "
                         "the same prompt; put {question} where the problem goes")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (a dataset file may be larger than memory allows twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_identity(args, train: list[dict], evals: dict[str, list[dict]]) -> dict:
    """What the run's problems are, recorded in the config line and run_config.json, for --resume to
    compare (identity_change): each local file's size and sha256 (--dataset, --eval-files), a hub
    dataset's name and config, the toy's parameters, and the sha256 of the problems as loaded
    (train in order, then each eval set), which also catches a hub dataset or the toy generator
    changing under the same name."""
    def file_id(path: str) -> dict:
        return {"file": path, "bytes": Path(path).stat().st_size, "sha256": file_sha256(Path(path))}

    ident = {}
    if args.dataset in ("toy", "arith"):
        ident["toy"] = {"seed": 0, "n_train": args.train_size, "n_test": args.eval_size}
        if arith.is_task(args):
            ident["toy"]["task"] = arith.LAB
        elif toy.task_of(toy.lab_name(args.model) or "toy") != "arith":
            ident["toy"]["task"] = toy.task_of(toy.lab_name(args.model))
    elif Path(args.dataset).suffix in (".jsonl", ".json", ".parquet"):
        ident["file"] = file_id(args.dataset)
    else:
        hub = DATASET_ALIASES.get(args.dataset, (args.dataset, None))
        ident["hub"] = {"name": hub[0], "config": hub[1]}
    ident["eval_files"] = [file_id(p) for p in args.eval_files]
    ident["sizes"] = {"train": len(train), **{name: len(records) for name, records in evals.items()}}
    blob = json.dumps([train, sorted(evals.items())], sort_keys=True, ensure_ascii=False)
    ident["records_sha256"] = hashlib.sha256(blob.encode()).hexdigest()
    return ident


def identity_change(saved: dict, now: dict) -> str | None:
    """What differs between two data_identity records, as '<file> changed' (None: nothing)."""
    files = [(saved.get("file"), now.get("file"))] + list(zip(saved.get("eval_files", []), now.get("eval_files", [])))
    for old, new in files:
        if old and new and (old["bytes"], old["sha256"]) != (new["bytes"], new["sha256"]):
            return (f"{new['file']} changed since the saved run ({old['bytes']} -> {new['bytes']} bytes, "
                    f"sha256 {old['sha256'][:12]} -> {new['sha256'][:12]})")
    if saved.get("records_sha256") != now.get("records_sha256"):
        return (f"the problems loaded from --dataset differ from the saved run's (sizes {saved.get('sizes')} -> "
                f"{now.get('sizes')})")
    return None


def format_prompt(question: str, tokenizer, args) -> str:
    text = args.prompt_template.replace("{question}", question)  # not .format: \boxed{} has braces
    use_chat = args.prompt_format == "chat" or (
        args.prompt_format == "auto" and args.model not in toy.TOY_MODELS and tokenizer.chat_template)
    if use_chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def drop_long_prompts(records: list[dict], tokenizer, args) -> tuple[list[dict], int]:
    """(problems whose formatted prompt fits --max-prompt-length tokens, how many were dropped).
    Skipped, not truncated: a question cut short is another question with the same reference answer."""
    L = args.max_prompt_length
    texts = [format_prompt(r["question"], tokenizer, args) for r in records]
    # Past 32 characters a token (natural text averages ~4) a prompt cannot fit: drop it untokenised,
    # since tokenising one 50 MB question alone takes gigabytes.
    short = [i for i, t in enumerate(texts) if len(t) <= 32 * L]
    lengths = tokenizer([texts[i] for i in short], add_special_tokens=False)["input_ids"] if short else []
    kept = [records[i] for i, ids in zip(short, lengths) if len(ids) <= L]
    return kept, len(records) - len(kept)


def fit_prompt_length(train_set: list[dict], eval_sets: dict[str, list[dict]], tokenizer, args,
                      counts: dict, need_train: bool = True) -> list[dict]:
    """Skip every problem past --max-prompt-length tokens, before any step can run out of memory:
    the training records kept (eval_sets is changed in place; a set left empty is dropped, since
    logging its accuracy would write NaN). counts['skipped_long_prompts'] gets how many were skipped."""
    train_set, dropped = drop_long_prompts(train_set, tokenizer, args)
    for name in list(eval_sets):
        eval_sets[name], n = drop_long_prompts(eval_sets[name], tokenizer, args)
        dropped += n
        if not eval_sets[name]:
            del eval_sets[name]  # no problems left: logging its accuracy would write NaN
    if dropped:
        counts["skipped_long_prompts"] = dropped
        print(f"note: skipped {dropped} problems whose prompt is over --max-prompt-length "
              f"{args.max_prompt_length} tokens", file=sys.stderr)
    if need_train and len(train_set) < args.prompts_per_step:
        raise SystemExit(f"error: {len(train_set)} training problems fit --max-prompt-length "
                         f"{args.max_prompt_length} < --prompts-per-step {args.prompts_per_step}: raise "
                         "--max-prompt-length or lower --prompts-per-step")
    return train_set


# ----------------------------------------------------------------------------------------------
# Prompt order (step 1 of train.py's loop): epochs over a small pool, so pass rates come from an
# earlier visit (docs/method-sources.md §3)
# ----------------------------------------------------------------------------------------------
class PromptSampler:
    """Draws M distinct dataset indices per step, a fresh seeded permutation per epoch."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def _order(self) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next(self, M: int) -> list[int]:
        if self.pos + M > self.n:  # drop the short tail: a batch never straddles two epochs
            self.epoch, self.pos = self.epoch + 1, 0
        ids = self._order()[self.pos:self.pos + M]
        self.pos += M
        return ids

    def record(self, prompt_ids, successes, totals) -> None:
        """A fixed order learns nothing from the rollouts (MoPPSSampler does: the same call)."""

    def log_fields(self) -> dict:
        """The sampler's own fields of the step's log record (train.py's rl_step): none here
        (MoPPSSampler: its Thompson draws)."""
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.epoch, self.pos = d["epoch"], d["pos"]


# ----------------------------------------------------------------------------------------------
# MoPPS (Qu et al., arXiv 2507.04632; thu-rllab/MoPPS recipe/ours/mopps.py `PosteriorSampler`):
# choose the prompts predicted nearest p = 0.5, a baseline beside CoBA-RL (--prompt-selection mopps)
# ----------------------------------------------------------------------------------------------
# Each prompt's success rate has a Beta posterior, Beta(1, 1) before any visit. A step draws
# ratio x M candidates (the next ones of the same seeded epoch order as PromptSampler: the released
# code enlarges the dataloader's batch by ts_ratio), draws theta_i ~ Beta(alpha_i, beta_i) for each
# (Thompson sampling), and keeps the M whose theta_i is nearest the target 0.5 ('topk', its launch
# scripts' strategy). After the rollouts each chosen prompt's posterior takes its successes and
# failures, decayed towards the prior by lambda (`bandit_decay_ratio`, config default 1.0 = no decay):
#     alpha_i <- lambda alpha_i + (1 - lambda) alpha_0 + s_i,   beta_i <- lambda beta_i + (1 - lambda) beta_0 + (n_i - s_i)
# The released code adds s_i * G with s_i the group's mean; with CoBA's unequal B_i (mopps+coba)
# the counts s_i and n_i - s_i are the same thing per rollout. Departures (ours, docs/arms.md):
# (1) theta from a numpy Generator seeded by (--seed, draw number), not the global np.random, so
#     a resumed run draws what an unbroken one would; (2) ties in |theta - 0.5| go to the earlier
#     candidate (a stable sort; the released np.argsort is not stable). Test: tests/test_arms_dapo_mopps.py
MOPPS_PRIOR = (1.0, 1.0)  # Beta(1, 1): uniform on [0, 1] (released `prior_alpha`, `prior_beta`)
MOPPS_TARGET = 0.5  # released `bandit_target_mean`: the pass rate with the largest GRPO signal p(1 - p)


def mopps_update(alpha: float, beta: float, successes: float, totals: float, decay: float = 1.0,
                 prior: tuple[float, float] = MOPPS_PRIOR) -> tuple[float, float]:
    """One visit into a prompt's Beta posterior: `successes` of `totals` rollouts right, the old
    counts decayed by lambda = `decay` towards the prior (the released `PosteriorSampler.train`)."""
    alpha_0, beta_0 = prior
    return (decay * alpha + (1.0 - decay) * alpha_0 + successes,
            decay * beta + (1.0 - decay) * beta_0 + (totals - successes))


def mopps_select(draws, M: int, target: float = MOPPS_TARGET) -> list[int]:
    """Positions of the M draws theta_i nearest `target` (squared distance, as released), nearest
    first; ties to the earlier position."""
    distance = [(float(theta) - target) ** 2 for theta in draws]
    return sorted(range(len(distance)), key=lambda k: distance[k])[:M]


class MoPPSSampler:
    """PromptSampler's interface (next, record, log_fields, state_dict) with MoPPS's choice inside: next(M)
    takes ratio * M candidates from a PromptSampler and keeps M by Thompson sampling; record()
    updates the posteriors from the same (prompt, successes, rollouts) visits CoBA's tracker gets."""

    def __init__(self, n: int, seed: int, ratio: int, decay: float = 1.0):
        self.order, self.seed, self.ratio, self.decay = PromptSampler(n, seed), seed, ratio, decay
        self.posterior: dict[int, tuple[float, float]] = {}  # prompt id -> (alpha_i, beta_i); absent: prior
        self.draws = 0  # selections made: seeds the next Thompson draw
        self.last_draws: list[float] = []  # theta of the M chosen prompts at the last next() (logged)

    def beta_params(self, prompt_ids) -> list[tuple[float, float]]:
        return [self.posterior.get(int(i), MOPPS_PRIOR) for i in prompt_ids]

    def next(self, M: int) -> list[int]:
        candidates = self.order.next(self.ratio * M)
        params = self.beta_params(candidates)
        rng = np.random.default_rng([self.seed, self.draws])
        self.draws += 1
        theta = rng.beta([a for a, _ in params], [b for _, b in params])  # (ratio * M,)
        chosen = mopps_select(theta, M)
        self.last_draws = [float(theta[k]) for k in chosen]
        return [candidates[k] for k in chosen]

    def log_fields(self) -> dict:
        """The step's log record's mopps_theta: theta of the M chosen prompts at the last next()."""
        return {"mopps_theta": [round(t, 4) for t in self.last_draws]}

    def record(self, prompt_ids, successes, totals) -> None:
        for i, s, n in zip(prompt_ids, successes, totals):
            alpha, beta = self.posterior.get(int(i), MOPPS_PRIOR)
            self.posterior[int(i)] = mopps_update(alpha, beta, float(s), float(n), self.decay)

    def state_dict(self) -> dict:
        return {**self.order.state_dict(), "draws": self.draws,
                "posterior": {str(i): [a, b] for i, (a, b) in self.posterior.items()}}

    def load_state_dict(self, d: dict) -> None:
        self.order.load_state_dict(d)
        self.draws = d["draws"]
        self.posterior = {int(i): (float(a), float(b)) for i, (a, b) in d["posterior"].items()}


def check_candidates(args, n: int) -> None:
    """MoPPS draws ratio x M distinct candidates a step from the n training problems, DAPO a block of
    --gen-batch-size prompts: at most n."""
    K = getattr(args, "gen_batch_size", None)
    if getattr(args, "dynamic_sampling", False) and K is not None and K > n:
        raise SystemExit(f"error: --gen-batch-size {K} prompts a DAPO block, more than the {n} training problems: "
                         "lower --gen-batch-size or raise --train-size")
    if getattr(args, "prompt_selection", "sampler") == "mopps" and args.mopps_ratio * args.prompts_per_step > n:
        raise SystemExit(f"error: --mopps-ratio {args.mopps_ratio} x --prompts-per-step {args.prompts_per_step}"
                         f" = {args.mopps_ratio * args.prompts_per_step} candidates a step, more than the "
                         f"{n} training problems: lower --mopps-ratio or raise --train-size")


def make_sampler(args, n: int):
    """Step 1's prompt order: --prompt-selection sampler (the seeded epochs every other arm shares)
    or mopps (MoPPSSampler, which draws its own)."""
    check_candidates(args, n)
    if getattr(args, "prompt_selection", "sampler") == "mopps":
        return MoPPSSampler(n, args.seed, args.mopps_ratio, args.mopps_decay)
    return PromptSampler(n, args.seed)

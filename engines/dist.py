"""Data-parallel CoBA-RL under `torchrun`: everything distributed, in one flat file.

    torchrun --nproc_per_node 2 train.py --steps 20          # 2 processes (gloo on CPU, NCCL on GPU)
    python train.py --steps 20                               # one process: every helper here is a no-op

What stays global and what is split (CoBA-RL, arXiv 2602.03048, docs/method-sources.md §3; docs/distributed.md):
  - Global: the M prompts, the tracker (p_i, F_t, alpha_t, beta_t) and Algorithm 1's B_i. Every rank
    draws the same prompts (same seed) and allocates from the same tracker; rank 0's budgets are then
    broadcast (`broadcast_object`) so that float differences between machines can never split the run.
  - Split: whole groups (prompt i with its B_i rollouts) go to ranks, balanced by rollout count
    (`balanced_partition`: Knapsack-RL's verl fork balances its batch the same way, arXiv 2509.25849).
    A group is never split, so its advantage (a z-score within the group) needs nothing from another rank.
  - Each rank generates only its groups; their rewards and completion lengths (small) are gathered
    (`gather_rows`), so the tracker, the advantages, the token-mean normaliser and the log see the
    whole step on every rank, exactly as one process would.
  - Gradients: each rank backpropagates its rows with the loss normalised by the GLOBAL token count of
    the mini-batch, then `all_reduce_grads` SUMS them, so the summed gradient is one process's.

Two ways to hold the model (`--fsdp`; the issue allowed DDP where it fits, our choice of default):
  - replicated (default): every rank holds the whole model and AdamW state, and the gradient is
    all-reduced by hand once per optimizer step (`all_reduce_grads`). Why the default: ranks hold
    different numbers of rows (balanced, not equal) and HF `generate` stops at a different step on
    each rank, and one flat all-reduce after the local accumulation needs nothing equal. It is exact.
  - `--fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`, one unit per decoder layer and the root)
    shards the weights, gradients and AdamW moments over ranks, for models whose training state does
    not fit one device (Qwen2.5-7B: docs/distributed.md's memory plan). FSDP2 all-gathers a unit's
    weights inside every forward and reduce-scatters its gradient inside every backward, so every
    rank must run the same number of them. Three rules keep that true with ragged groups:
      1. generation and no-grad forwards run inside `gathered(model)`: the whole model unsharded
         once (TRL gathers ZeRO-3 weights for generation the same way) and no collective until it
         ends, so ranks may decode for different numbers of steps;
      2. training micro-batches are padded to the same count on every rank (`max_over_ranks`); a pad
         micro-batch backpropagates a loss times 0 (it adds exact zeros). --shared-prompt-forward
         is off (1 or 2 forwards a micro-batch, depending on its rows, would break the count);
      3. gradients are SUMMED by the reduce-scatter (`shard` sets divide factor 1 and a plain SUM:
         gloo has no pre-multiplied sum), so the loss normaliser is the same global one as above.
    Checkpoints stay in the one-process format: `full_state` gathers the full weights and optimizer
    state to rank 0 (a collective, on CPU), and `load_full_state` cuts each rank's shard out of them
    with no collective (rank 0 loads alone while it looks for an undamaged checkpoint). For 7B that
    means rank 0 holds ~7.6e9 x 12 bytes ~ 91 GB of CPU memory at a save; torch.distributed.checkpoint
    (sharded files) would avoid it and is not used here (ours, said so).

Rank 0 alone writes the log, trackers, plots and checkpoints (`on_rank0` runs a writer there and
hands its result, or its one-line error, to every rank). A checkpoint holds every rank's RNG state
(`gather_object`). Tests: tests/test_dist.py (2 processes, gloo, the toy).
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class Ranks:
    """Where this process stands: rank r of world_size W (W = 1 without torchrun)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or tdist.is_initialized()

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """torchrun (and torch.distributed.run) set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR for each worker."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def init(device_type: str, timeout_minutes: float = 30.0) -> Ranks:
    """Join the process group torchrun prepared (NCCL on GPU, gloo on CPU); without torchrun, Ranks().

    On GPU each process takes cuda:LOCAL_RANK. The timeout bounds how long a rank waits in a collective
    for a peer that died; torchrun itself stops the other workers when one exits with an error."""
    if not launched_by_torchrun():
        return Ranks()
    ranks = Ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if not tdist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(ranks.local_rank)
        import_before_group()
        tdist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
        global _STARTED
        _STARTED = True
    return ranks


_STARTED = False  # did init() start the process group (not vLLM's in-process engine, which starts its own)?

# torch modules that bind the live default group into default arguments when they are imported
# (torch.distributed.nn.functional: `def broadcast(tensor, src, group=group.WORLD)` and 9 more; the
# fsdp, DTensor and checkpoint imports below pull it in). Imported after init_process_group, they
# keep the ProcessGroupGloo alive past destroy_process_group: its threads (pt_gloo_runloop x2,
# gloo_tcp_loop) then run on into interpreter shutdown, and a rank could abort at exit with
# "terminate called without an active exception" (SIGABRT; docs/testing.md, "Teardown under load").
# Imported first, those defaults are None. `gathered`, `shard`, `full_state` import them lazily.
_BIND_WORLD_AT_IMPORT = ("torch.distributed.nn", "torch.distributed.fsdp", "torch.distributed.tensor",
                         "torch.distributed.checkpoint.state_dict")


def import_before_group() -> None:
    """Import _BIND_WORLD_AT_IMPORT while no process group exists (init calls it)."""
    import importlib

    for name in _BIND_WORLD_AT_IMPORT:
        importlib.import_module(name)


def teardown() -> None:
    """Destroy the process group init() started, and only that: vLLM's in-process CPU engine starts a
    one-process group of its own and destroys it at exit (destroying it here made that exit print
    "ValueError: Invalid process group specified"). Nothing of ours holds the group, so this frees
    it and joins gloo's threads before the interpreter exits (see _BIND_WORLD_AT_IMPORT)."""
    global _STARTED
    if _STARTED and tdist.is_initialized():
        release_vllm_groups()
        if tdist.is_initialized():  # (vLLM's destroy_distributed_environment destroys it too)
            tdist.destroy_process_group()
    _STARTED = False


def release_vllm_groups() -> None:
    """--use-vllm under torchrun: vLLM's external_launcher made its own groups inside our world, and
    its GroupCoordinators (vllm.distributed.parallel_state) hold them, so destroy_process_group alone
    would leave their gloo threads running into interpreter shutdown. vLLM's own cleanup, in its
    order (cleanup_dist_env_and_memory: model-parallel groups, then its world group, then the
    default group), before ours. Nothing if vLLM was never imported."""
    import sys

    ps = sys.modules.get("vllm.distributed.parallel_state")
    if ps is None:
        return
    try:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    except Exception as e:  # noqa: BLE001 - the run is over: say it, and still destroy our group
        print(f"warning: vLLM's process groups were not destroyed cleanly: {type(e).__name__}: {e}",
              file=sys.stderr)


def current() -> Ranks:
    """The Ranks of an initialised process group, else Ranks() (one process)."""
    if not tdist.is_initialized():
        return Ranks()
    return Ranks(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


# ----------------------------------------------------------------------------------------------
# Whole groups to ranks, balanced by rollout count (a small pure function: tests call it directly)
# ----------------------------------------------------------------------------------------------
def balanced_partition(budgets: list[int], world_size: int) -> list[list[int]]:
    """Prompt positions i of each rank: every group i (B_i rollouts) goes whole to one rank.

    Longest-processing-time greedy: groups by B_i, largest first (ties: lower i first), each to the
    rank with the fewest rollouts so far (ties: lower rank). Bound: the most-loaded rank's last group
    went to it when it was the least loaded, so max load - min load <= that group's B_i <= max_i B_i
    ("imbalance at most one group"). Equal budgets (uniform GRPO) give an even split, groups dealt
    round-robin. Each rank's positions come back sorted, so its rows stay prompt-major.
    budgets: (M,) B_i. Returns world_size lists of positions; together they are 0..M-1, each once."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load, owned = [0] * world_size, [[] for _ in range(world_size)]
    for i in sorted(range(len(budgets)), key=lambda i: (-budgets[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owned[r].append(i)
        load[r] += budgets[i]
    return [sorted(o) for o in owned]


def imbalance(budgets: list[int], owned: list[list[int]]) -> tuple[list[int], int]:
    """(rollouts of each rank, max - min): what each step logs."""
    per_rank = [sum(budgets[i] for i in o) for o in owned]
    return per_rank, max(per_rank) - min(per_rank)


@dataclass
class Share:
    """This rank's part of one step: the groups it generates and trains on, and where their rows sit
    in the step's N prompt-major rows (group 0's B_0 rows, then group 1's, ...)."""
    budgets: list[int]  # (M,) B_i of the whole step
    owned: list[list[int]]  # balanced_partition(budgets, W): prompt positions of each rank
    rank: int = 0

    @classmethod
    def of(cls, budgets: list[int]) -> "Share":
        ranks = current()
        return cls(list(budgets), balanced_partition(list(budgets), ranks.world_size), ranks.rank)

    def local_budgets(self) -> list[int]:
        """(M,) B_i for this rank's groups, 0 for the others' (generate_groups makes no row for 0)."""
        mine = set(self.owned[self.rank])
        return [B if i in mine else 0 for i, B in enumerate(self.budgets)]

    def rows(self) -> torch.Tensor:
        """(n,) index into the N rows of each of this rank's rows, in its own prompt-major order."""
        starts = [0]
        for B in self.budgets:
            starts.append(starts[-1] + B)
        return torch.tensor([r for i in self.owned[self.rank] for r in range(starts[i], starts[i + 1])],
                            dtype=torch.long)

    def record(self) -> dict:
        """What the step's JSONL line says of the split (nothing in one process)."""
        if len(self.owned) == 1:
            return {}
        per_rank, spread = imbalance(self.budgets, self.owned)
        return {"rank_rollouts": per_rank, "rank_imbalance": spread}


def micro_batches(global_chunk: torch.Tensor, rows: torch.Tensor, N: int, size: int, sharded: bool = False,
                  by_prompt: bool = False):
    """This rank's micro-batches of one global mini-batch, as (positions in this rank's batch, pad).

    global_chunk: the mini-batch, indices into the step's N rows; rows: Share.rows(), this rank's
    rows among them (one process: all N). Each micro-batch holds up to `size` of this rank's rows of
    the mini-batch, in the mini-batch's order (by_prompt: sorted, so that a prompt's rows, adjacent in
    the prompt-major batch, share micro-batches). --fsdp (sharded): every rank runs as many
    micro-batches as the busiest one (rule 2); the extra ones are pads, pad = True: a row of this
    rank to run forward and backward with weight 0, so they add exact zeros."""
    chunk = local_rows(global_chunk, rows, N)
    if by_prompt:
        chunk = chunk.sort().values
    n_micro = -(-len(chunk) // size)
    if sharded:
        n_micro = max_over_ranks(n_micro)
    for s in range(0, n_micro * size, size):
        pad = s >= len(chunk)
        yield (chunk[s:s + size] if not pad else torch.arange(min(1, len(rows)))), pad


def local_rows(global_chunk: torch.Tensor, rows: torch.Tensor, N: int) -> torch.Tensor:
    """Positions in this rank's batch of the rows of a global mini-batch, in the mini-batch's order.
    global_chunk: indices into the N rows; rows: Share.rows(). One process: global_chunk itself."""
    position = torch.full((N,), -1, dtype=torch.long)  # (N,) local position of each row, -1: another rank's
    position[rows] = torch.arange(len(rows))
    local = position[global_chunk]
    return local[local >= 0]


# ----------------------------------------------------------------------------------------------
# Collectives (each a no-op in one process)
# ----------------------------------------------------------------------------------------------
def broadcast_object(obj, src: int = 0):
    """rank src's obj on every rank (pickled: for small things such as the budgets)."""
    if not tdist.is_initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def gather_object(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank ([obj] in one process)."""
    if not tdist.is_initialized():
        return [obj]
    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def gather_groups(owned: list[list[int]], local: list) -> list:
    """Per-group values computed on the rank that owns each group -> the list over all M groups in
    prompt order, on every rank. owned: balanced_partition's answer; local: this rank's values, one
    per owned position, in the order of owned[rank]."""
    parts = gather_object(local)
    out = [None] * sum(map(len, owned))
    for positions, values in zip(owned, parts):
        for i, v in zip(positions, values):
            out[i] = v
    return out


def gather_rows(share: Share, *columns: list) -> list[list]:
    """Per-row values of this rank's rows (its groups, prompt-major: rewards, completion lengths, ...)
    -> each column over the step's N rows of every rank, prompt-major, on every rank (one gather for
    all columns). The same lists as one process computes them (its rows are all N)."""
    own, at = [], 0
    for i in share.owned[share.rank]:  # per own group: its slice of each column
        B = share.budgets[i]
        own.append(tuple(column[at:at + B] for column in columns))
        at += B
    groups = gather_groups(share.owned, own)  # (M,) in prompt order, every rank's groups
    return [[x for g in groups for x in g[c]] for c in range(len(columns))]


def over_ranks(roll) -> dict:
    """A step's generation time and verifier counts over every rank (roll: engines/step_data.StepRollouts, this
    rank's), like the rest of its record . A collective: every
    rank calls it. verify_timeouts and verify_errors are SUMMED: each rank verified only its own
    rows, so the sum counts each rollout once, as one process would. gen_seconds is the MAX: the ranks generate at the same time, so the
    step waited for the slowest one before its gathers; a sum would count parallel seconds twice."""
    parts = gather_object((roll.gen_seconds, roll.vstats.timeouts, roll.vstats.errors))  # one triple per rank
    return {"gen_seconds": round(max(p[0] for p in parts), 3), "verify_timeouts": sum(p[1] for p in parts),
            "verify_errors": sum(p[2] for p in parts)}


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum every parameter's gradient over ranks, in one flat all-reduce (a rank with no rows in a
    mini-batch contributes zeros). Called once per optimizer step, before clipping: each rank's loss
    is already divided by the global normaliser, so the SUM (not DDP's mean) is one process's gradient."""
    if not tdist.is_initialized():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def all_reduce_sums(sums: dict[str, float], keep: tuple[str, ...] = ()) -> dict[str, float]:
    """Add each metric over ranks (each rank's value is its share of a whole-batch mean or sum);
    keys in `keep` are already global (the same on every rank) and stay as they are. The keys are
    every rank's together, a rank lacking one adding 0: a rank that owns no group this step (fewer
    prompts than ranks) computed no loss metrics at all, and an all-reduce of tensors of different
    lengths would hang."""
    if not tdist.is_initialized():
        return sums
    keys = sorted({k for part in gather_object(sorted(k for k in sums if k not in keep)) for k in part})
    if not keys:
        return sums
    t = torch.tensor([float(sums.get(k, 0.0)) for k in keys], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return {**sums, **dict(zip(keys, t.tolist()))}


def any_rank(flag: bool) -> bool:
    """True on every rank if it is True on any (a Ctrl-C seen by one rank stops all at the same step)."""
    if not tdist.is_initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_params(model: torch.nn.Module) -> None:
    """Rank 0's weights on every rank (as DDP does at wrap time): ranks start from one policy."""
    if not tdist.is_initialized():
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            tdist.broadcast(t.data, src=0)


def seed_rank(seed: int) -> None:
    """A torch seed of this rank's own for HF sampling (rank 0 keeps --seed: one process is unchanged).
    Without it every rank would draw the same random numbers for its different rollouts."""
    r = current().rank
    if r > 0:
        torch.manual_seed(seed * 1_000_003 + r)


def own_rng(device: torch.device | None):
    """torch.random.fork_rng over the CPU and this rank's own device only (cuda:LOCAL_RANK under
    torchrun; --device's): devices=None would save and restore every visible GPU's RNG, initialising
    CUDA on each of them from every rank. None or a CPU device: the CPU RNG alone."""
    return torch.random.fork_rng(devices=[device] if device is not None and device.type == "cuda" else [])


def on_rank0(fn, *args, **kwargs):
    """Run fn on rank 0 only and hand its result to every rank. A one-line SystemExit of rank 0 (a
    refused --resume, a full disk) is raised on every rank, so all stop with the same message
    instead of the others waiting at the next collective."""
    if not tdist.is_initialized():
        return fn(*args, **kwargs)
    result, error = None, None
    if tdist.get_rank() == 0:
        try:
            result = fn(*args, **kwargs)
        except SystemExit as e:
            error = e.code
    result, error = broadcast_object((result, error))
    if error is not None:
        raise SystemExit(error)
    return result


# ----------------------------------------------------------------------------------------------
# --fsdp: FSDP2 sharding (the three rules of the module docstring)
# ----------------------------------------------------------------------------------------------
def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 in place: one unit per block HF marks as not to be split (`_no_split_modules`, e.g.
    Qwen2DecoderLayer: what accelerate wraps too), then the root (embeddings, final norm, tied lm_head).
    Gradients are summed over ranks, not averaged (rule 3). Call after broadcast_params and before
    the optimizer is made: the optimizer must see the sharded parameters (DTensors)."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in blocks]
    if not units:
        raise SystemExit(f"error: --fsdp found no decoder blocks to shard in {type(model).__name__} (it shards "
                         "the classes in the model's _no_split_modules): drop --fsdp")
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    for unit in fsdp_units(model):
        unit.set_gradient_divide_factor(1.0)  # the SUM of the ranks' gradients (the loss is globally normalised)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM reduce-scatter: gloo has no PREMUL_SUM
    return model


def fsdp_units(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model) -> bool:
    return bool(fsdp_units(model)) if tdist.is_initialized() else False


@contextlib.contextmanager
def gathered(model: torch.nn.Module):
    """Rule 1: inside, the whole model is unsharded (each unit all-gathered once, on entry) and
    forwards communicate nothing, so ranks may run different numbers of them (HF generate, vLLM's
    weight push through named_parameters, the no-grad log-prob forwards). Resharded on exit.
    A no-op for a model that is not sharded."""
    units = fsdp_units(model) if tdist.is_initialized() else []
    if not units:
        yield model
        return
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def max_over_ranks(n: int) -> int:
    """Rule 2: the largest n of any rank (n itself in one process)."""
    if not tdist.is_initialized():
        return n
    t = torch.tensor([n], dtype=torch.long)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t.item())


def grad_norm(total) -> float:
    """clip_grad_norm_'s answer as a float: a DTensor (replicated over ranks) under --fsdp."""
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


def _param_aliases(model) -> set[str]:
    """Names of tied duplicates (lm_head.weight tied to embed_tokens.weight): named_parameters lists a
    shared parameter once, so the full state dict drops the others, as save_pretrained does."""
    once = {n for n, _ in model.named_parameters()}
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - once


def full_state(model, optimizer) -> tuple[dict, dict]:
    """(weights, optimizer state), full and on CPU, on rank 0; ({}, {}) on the others. A collective:
    every rank calls it. The optimizer state is keyed by parameter name (torch's full format)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    aliases = _param_aliases(model)
    return {k: v for k, v in weights.items() if k not in aliases}, optim


def _local_shard(full: torch.Tensor, like) -> torch.Tensor:
    """This rank's shard of a full tensor, laid out as the DTensor `like` (no communication:
    src_data_rank=None cuts it from the local copy every rank holds)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def load_full_state(model, optimizer, weights: dict, optim: dict | None) -> None:
    """full_state's inverse, on one rank alone (no collective). weights: name -> full tensor (a tied
    duplicate may be absent); optim: full_state's optimizer part (name-keyed), or None to leave it."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise KeyError(f"the checkpoint lacks {missing[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            src = _local_shard(weights[name].to(p.device), p)
            (p.to_local() if hasattr(p, "to_local") else p).copy_(src.to_local() if hasattr(src, "to_local") else src)
    if optim is None:
        return
    order = [n for n, _ in model.named_parameters()]  # the optimizer was made from model.parameters()
    index = {n: i for i, n in enumerate(order)}
    state = {}
    for name, s in optim["state"].items():
        p = params[name]
        state[index[name]] = {k: (_local_shard(v.to(p.device), p) if torch.is_tensor(v) and v.shape == p.shape else v)
                              for k, v in s.items()}
    groups = []
    for saved, live in zip(optim["param_groups"], optimizer.state_dict()["param_groups"]):
        groups.append({**saved, "params": live["params"]})
    optimizer.load_state_dict({"state": state, "param_groups": groups})

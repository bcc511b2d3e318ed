"""Data-parallel CoBA-RL under `torchrun`: everything distributed, in one flat file.

    torchrun --nproc_per_node 2 train.py --steps 20          # 2 processes (gloo on CPU, NCCL on GPU)
    python train.py --steps 20                               # one process: every helper here is a no-op

What stays global and what is split (CoBA-RL, arXiv 2602.03048, method.md §3; docs/distributed.md):
  - Global: the M prompts, the tracker (p_i, F_t, alpha_t, beta_t) and Algorithm 1's B_i. Every rank
    draws the same prompts (same seed) and allocates from the same tracker; rank 0's budgets are then
    broadcast (`broadcast_object`) so that float differences between machines can never split the run.
  - Split: whole groups (prompt i with its B_i rollouts) go to ranks, balanced by rollout count
    (`balanced_partition`: Knapsack-RL's verl fork balances its batch the same way, arXiv 2509.25849).
    A group is never split, so its advantage (a z-score within the group) needs nothing from another rank.
  - Each rank generates only its groups; their rewards and completion lengths (small) are gathered
    (`gather_groups`), so the tracker, the advantages, the token-mean normaliser and the log see the
    whole step on every rank, exactly as one process would.
  - Gradients: each rank backpropagates its rows with the loss normalised by the GLOBAL token count of
    the mini-batch, then `all_reduce_grads` SUMS them, so the summed gradient is one process's.

Departure (ours, said so; the issue allowed DDP where simpler): the model is replicated, like DDP, and
the gradient is all-reduced by hand once per optimizer step, not sharded with FSDP2 (`fully_shard`).
Why: ranks hold different numbers of rows (balanced, not equal) and HF `generate` stops at a
different step on each rank. FSDP2 all-gathers weights inside every forward and torch's DDP wrapper
all-reduces inside every backward, so both need every rank to run the same number of forwards and
backwards, which ragged groups break (padding ranks with dummy micro-batches and dummy decode steps
would be the fix). One flat all-reduce after the local accumulation has no such constraint and is
exact. The cost is memory: each rank holds the whole model and AdamW state (docs/distributed.md has
the arithmetic for Qwen2.5-7B, and what FSDP2 would save).

Rank 0 alone writes the log, trackers, plots and checkpoints (`on_rank0` runs a writer there and
hands its result, or its one-line error, to every rank). A checkpoint holds every rank's RNG state
(`gather_object`). Tests: tests/test_dist.py (2 processes, gloo, the toy).
"""
from __future__ import annotations

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
        tdist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return ranks


def teardown() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()


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
    keys in `keep` are already global (the same on every rank) and stay as they are."""
    if not tdist.is_initialized() or not sums:
        return sums
    keys = sorted(k for k in sums if k not in keep)
    t = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64)
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

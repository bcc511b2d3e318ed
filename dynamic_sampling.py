"""DAPO's dynamic sampling (Yu et al., arXiv 2503.14476, §3.2, eq. 11), a baseline beside CoBA-RL.

A GRPO group whose G rewards are all equal (all right or all wrong) has zero advantage and adds no
gradient: DAPO "over-samples and filters out prompts with the accuracy equal to 1 and 0". The
released recipe (verl `algorithm.filter_groups`, recipe/dapo `dapo_ray_trainer.py`) does it in
blocks: generate K prompts x G rollouts (K = verl's data.gen_batch_size, our --gen-batch-size:
3 x M in the DAPO recipe, M by default here), keep the groups whose rewards have std > 0, and
generate another block of the next K prompts until M groups are kept; the first M kept groups, in
generation order, make the batch, and the surplus is dropped. Every rollout generated counts as
spent, the dropped ones included: that is DAPO's price for a batch with no zero-signal group, and
what compare.py's equal-rollouts axis charges it (docs/arms.md).

    has_signal        verl's rule: std of the group's rewards > 0, or a group of one rollout
    dynamic_sample    the refill loop over blocks, with the block limit; pure (a callback makes
                      each block), so tests drive it with scripted rewards

Departures (docs/arms.md):
(1) The block limit (`--max-num-gen-batches`, verl's `max_num_gen_batches`, DAPO recipe 10; 0 or
    less: no limit, as in verl): at the limit verl raises ValueError and the run stops; we update on the partial batch (the groups kept
    so far, fewer than M) and log it (`dapo_partial`). A run of a fixed rollout budget should not
    crash because a model became too good (or too bad) for its prompts.
(2) Under train.py's `--max-rollouts` the limit is also the number of blocks the budget has left,
    so a run ends at exactly its rollout budget, the last update maybe on a partial batch.
(3) A partial batch with no group at all (every group of every block zero-signal) makes no
    optimizer step (train.py): its gradient is zero, and AdamW's momentum alone would still move the
    weights. verl cannot get there (it raises first).
Tests: tests/test_arms_dapo_mopps.py (a hand-worked refill with scripted rewards; the wiring in train.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Group:
    """One prompt's rollouts from one block: its dataset index, its G binary rewards, and whatever the
    trainer carries along for the update (completion ids, log-probs): `payload`, never read here."""
    prompt: int
    rewards: list[float]
    payload: object = None


def has_signal(rewards) -> bool:
    """verl's filter: keep a group whose rewards' std is > 0, i.e. not all equal (and, as verl, a
    group of one rollout, whose std is undefined). Zero-signal groups have zero GRPO advantage."""
    return len(rewards) == 1 or max(rewards) != min(rewards)


@dataclass
class DynamicBatch:
    """What one update's dynamic sampling produced."""
    kept: list[Group]  # the batch: at most M groups with signal, in generation order
    generated: list[Group] = field(default_factory=list)  # every group of every block (visits)
    blocks: int = 0  # generation blocks of K prompts x G rollouts this update used
    surplus_groups: int = 0  # groups with signal kept beyond M and dropped (verl: batch[:M * G])
    partial: bool = False  # the block limit came first: fewer than M groups kept (departure 1)

    @property
    def rollouts(self) -> int:
        """Rollouts spent: every generated one, the dropped groups' included."""
        return sum(len(g.rewards) for g in self.generated)

    @property
    def zero_signal_groups(self) -> int:
        return sum(not has_signal(g.rewards) for g in self.generated)

    @property
    def zero_signal_rollouts(self) -> int:
        return sum(len(g.rewards) for g in self.generated if not has_signal(g.rewards))


def dynamic_sample(next_block: Callable[[int], list[Group]], M: int, max_blocks: int | None) -> DynamicBatch:
    """Generate blocks until M groups with signal are kept, or `max_blocks` blocks are spent (None: no
    limit, verl's max_num_gen_batches <= 0; the loop then ends only when M groups are kept).

    next_block(b) -> the groups of block b (b = 0, 1, ... within this update): the caller draws the
    next gen_batch_size prompts (M by default) and their G rollouts each. Returns the first M groups
    with signal (fewer at the limit: partial), every generated group, and the blocks used. Blocks are
    whole: a block is generated (and paid for) in full even when its first groups already complete
    the batch, as in verl, which generates gen_batch_size prompts at a time."""
    if M < 1 or (max_blocks is not None and max_blocks < 1):
        raise ValueError(f"dynamic_sample needs M >= 1 and max_blocks >= 1, got M={M}, max_blocks={max_blocks}")
    out = DynamicBatch(kept=[])
    with_signal: list[Group] = []
    while len(with_signal) < M and (max_blocks is None or out.blocks < max_blocks):
        block = next_block(out.blocks)
        out.blocks += 1
        out.generated += block
        with_signal += [g for g in block if has_signal(g.rewards)]
    out.kept, out.surplus_groups = with_signal[:M], max(0, len(with_signal) - M)
    out.partial = len(out.kept) < M
    return out

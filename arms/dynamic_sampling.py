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
    dapo_rollouts     one update of train.py's arm: the refill over blocks that train.py samples
                      (a callback), the block limit also the blocks --max-rollouts has left
                      (departure 2), each group carrying its rows
    DynamicBatch      what one update produced, all train.py's rl_step needs of it: the kept groups
                      (the batch: `kept_rows`), every generated group as a visit for the tracker and
                      MoPPS (`visits`), the rollouts spent, and the log's accounting (`accounting`)

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
    gen_seconds: float = 0.0  # generation time of every block (dapo_rollouts)

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

    @property
    def spent_rewards(self) -> list[float]:
        """Every generated rollout's reward, in generation order (the log's reward and reward_std)."""
        return [r for g in self.generated for r in g.rewards]

    def kept_rows(self) -> dict:
        """The batch as the update reads it, from the kept groups' payloads (dapo_rollouts'): per
        group its prompt, tokens, answer, text and size; per row (prompt-major) its completion,
        reward and sampler log-probs."""
        kept = self.kept
        return {"prompt_idx": [g.prompt for g in kept], "prompt_tok_m": [g.payload[0] for g in kept],
                "answers_m": [g.payload[1] for g in kept], "prompts": [g.payload[2] for g in kept],
                "budgets": [len(g.rewards) for g in kept], "completion_ids": [c for g in kept for c in g.payload[3]],
                "rewards": [r for g in kept for r in g.rewards], "lp_rows": [lp for g in kept for lp in g.payload[4]]}

    def visits(self) -> tuple[list[int], list[float], list[int], list[list[float]]]:
        """Every generated group as one visit of its prompt, in generation order, the dropped ones
        too (each was a real outcome of the policy): (prompts, successes, rollouts, rewards), what
        the tracker's update and MoPPS's posteriors record."""
        g = self.generated
        return ([x.prompt for x in g], [float(sum(x.rewards)) for x in g], [len(x.rewards) for x in g],
                [list(x.rewards) for x in g])

    def accounting(self) -> dict:
        """The log's counts over every rollout this update spent (the dropped groups' included, as
        compare.py's equal-rollouts axis charges them), then DAPO's own: blocks, kept and surplus
        groups, and whether the block limit came first (departure 1)."""
        return {"frac_reward_zero_std": self.zero_signal_groups / len(self.generated),
                "zero_signal_groups": self.zero_signal_groups, "zero_signal_rollouts": self.zero_signal_rollouts,
                "step_rollouts": self.rollouts, "step_groups": len(self.generated), "dapo_blocks": self.blocks,
                "dapo_kept_groups": len(self.kept), "dapo_surplus_groups": self.surplus_groups,
                "dapo_partial": self.partial}


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



def dapo_rollouts(sample_block: Callable[[int], tuple], M: int, budgets: list[int], max_blocks: int,
                  rollouts_left: int | None = None) -> DynamicBatch:
    """One update of train.py's DAPO arm: dynamic_sample until M groups carry signal, over blocks of K
    prompts with `budgets` (K of them, G each), at most `max_blocks` (--max-num-gen-batches; 0 or less:
    no limit, as in verl) and, under --max-rollouts (rollouts_left: what the budget has left), no more
    blocks than it pays for (departure 2), so that a run ends at exactly its budget.
    sample_block(b) -> (roll, completion ids, rewards) of block b, rows prompt-major; roll
    (engines/step_data.StepRollouts) gives the block's prompts, their tokens, answers and texts, the rows' sampler
    log-probs (round 0) and its generation seconds. Each group carries its prompt's and rows' share of
    them as payload, for DynamicBatch.kept_rows."""
    seconds, ends = [], [sum(budgets[:k + 1]) for k in range(len(budgets))]

    def next_block(b: int) -> list[Group]:
        roll, ids, rewards = sample_block(b)
        seconds.append(roll.gen_seconds)
        lps = roll.sampler_lps[0]
        return [Group(j, rewards[e - B:e], (roll.prompt_tok_m[k], roll.answers_m[k], roll.prompts[k], ids[e - B:e],
                                             lps[e - B:e]))
                for k, (j, B, e) in enumerate(zip(roll.prompt_idx, budgets, ends))]

    limit = max_blocks if max_blocks > 0 else None  # verl: 0 or less is no limit
    if rollouts_left is not None:  # departure (2): no more blocks than the rollout budget has left
        left = rollouts_left // sum(budgets)
        limit = left if limit is None else min(limit, left)
    out = dynamic_sample(next_block, M, limit)
    out.gen_seconds = sum(seconds)
    return out

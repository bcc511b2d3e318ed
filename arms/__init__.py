"""The arms beside the paper's CoBA-RL: what each baseline or diagnostic changes in one RL step
(docs/arms.md). The paper's own arm needs nothing from here."""

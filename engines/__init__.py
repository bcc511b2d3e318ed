"""The engines beneath the paper's loop: generation (HF and vLLM, weight sync), LoRA, torchrun and
FSDP2, the policy update at scale and vLLM's sampler correction, checkpoints and resume, experiment
tracking, the grading worker pool. train.py reaches them
through its generate and update calls; of the other paper files only verify.py imports one
(grading.py, the timeout its symbolic check runs under)."""

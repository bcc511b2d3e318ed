"""The engines beneath the paper's loop: generation (HF and vLLM, weight sync), LoRA, torchrun and
FSDP2, checkpoints and resume, experiment tracking. train.py reaches them through its generate and
update calls; the paper files (coba.py, allocate.py, grpo.py, verify.py) import none of them."""

"""Benchmarks of the fine-tuning modes (`finetune: full | lora`)."""

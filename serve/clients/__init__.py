"""Light clients of the quorum reward service for the trainers people already run (docs/trainers.md): TRL's
GRPOTrainer (`serve.clients.trl`), verl's custom reward function (`serve.clients.verl`) and OpenRLHF's reward_func
file (`serve.clients.openrlhf`; OpenRLHF's plain HTTP path needs no client: `POST /openrlhf` on the service).

They import httpx and the standard library only (no ray, no torch, nothing of the Serve app): a trainer's process
loads them in milliseconds. They sit in the `serve` layer because they speak its wire format and nothing else;
quorum's own GRPO client (`train.grpo.reward.client`) is the training loop's, with its GroupOutcome and torch.
"""

"""Clients of the quorum reward service for the trainers people already run (docs/trainers.md), installable on
their own (`pip install ./clients`) into a trainer's pinned environment:

- `quorum_clients.trl`: TRL's GRPOTrainer reward function (`QuorumReward`), whole groups across processes;
- `quorum_clients.openrlhf`: OpenRLHF's `reward_func` file (`--reward.remote_url <its path>`);
- `quorum_clients.verl`: verl's custom reward functions, and `quorum_clients.verl_manager` the reward-loop manager
  that judges a prompt's rollouts as one group (that module imports verl: load it in verl's environment only).

They import httpx and the standard library only (no torch, no ray, nothing of quorum): a trainer's process loads
them in milliseconds. `quorum_clients.http` holds the HTTP client they share, `quorum_clients.text` the
normalisation of trainer text (chat markup) before it reaches the judge.
"""

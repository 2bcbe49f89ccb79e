"""Processes: torch.distributed set-up, the process-group collective, torchrun's
rendezvous, elastic restarts and the resumable sampler."""

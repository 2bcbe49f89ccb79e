"""What a training run keeps across crashes: checkpoints and their exact resume."""

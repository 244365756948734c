"""Training: the engine, the step, the loop, learning rates and optimizers."""

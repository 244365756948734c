"""Run safety: what keeps a long run from losing work (the loss and gradient guard, ...), each
part a small module the training loop wires in and each testable alone."""

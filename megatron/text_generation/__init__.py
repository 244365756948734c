"""Text generation from trained checkpoints; the model-loading half is shared with evaluation.

- `sampling`: the pure logits -> token ids function (greedy, temperature, top-k, top-p).
- checkpoints are found, verified and read as canonical full tensors by
  `megatron.checkpointing.reader` (the architecture check is `checkpointing.model_shape`).
- `inference_model`: `InferenceModel`, the eval-mode GPTModel behind one forward (A25).
- `runtime`: process groups for inference (tp honoured, pp folded into replicas), replicas.
- `checks`: stop ids (A13), prompt lengths (A14), KV-cache memory (A29).
- `generation`: batched, left-padded decoding with a KV cache or recompute.
- `prompts`: the input file's prompts (read by deepy.py too, before any worker starts).
- `modes`: generate.py's unconditional / input-file / interactive runs writing JSON lines.
"""

"""Scoring checkpoints with lm-evaluation-harness (eval.py).

- `lm_eval_version`: the supported lm-eval range, checked before lm_eval is imported (A28).
- `windows`: model-sized windows so long inputs are scored exactly once each (A26).
- `scoring`: batched, vocab-parallel fp32 log-likelihoods, checked at the boundary (A27).
- `adapter`: `NeoXLM`, the lm-eval LM subclass (loglikelihood, rolling, generate_until).
- `tasks`: registry names, local task YAMLs and directories -> an lm-eval TaskManager.
- `run`: eval.py's run: load the checkpoint, evaluate, write JSON and tracker metrics.
The model is loaded by megatron.text_generation (runtime, inference_model).
"""

"""The text-generation and evaluation sections."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class TextGenerationArgs:
    """Sampling from a trained model (generate.py)."""

    text_gen_type: str | None = option(
        None,
        "Generation mode: unconditional, input-file or interactive; null means input-file when "
        "sample_input_file is set, else unconditional (args.derived.text_gen_type).",
    )
    sample_input_file: str | None = option(None, "Prompts file for input-file mode, one per line.")
    sample_output_file: str = option("samples.txt", "File the generated samples are written to.")
    num_samples: int = option(1, "Number of samples in unconditional mode.")
    maximum_tokens: int = option(64, "Most tokens generated per prompt.")
    temperature: float = option(0.0, "Sampling temperature; 0 picks the most likely token.")
    top_k: int = option(0, "Sample only among the k most likely tokens (0: no limit).")
    top_p: float = option(
        0.0, "Sample only among the most likely tokens whose probability sums to p (0: off)."
    )
    recompute: bool = option(
        False, "Recompute attention over the whole sequence each step instead of a KV cache."
    )
    prompt_end: str = option("\n", "Separator that ends each prompt in the input file.")


@dataclass(frozen=True)
class EvalArgs:
    """Evaluation with lm-evaluation-harness (eval.py)."""

    eval_tasks: list[str] | None = option(None, "lm-evaluation-harness task names to run.")
    eval_results_prefix: str = option(
        "", "Prefix of the results file ({prefix}_eval_results_<date>.json)."
    )
    eval_num_fewshot: int = option(
        0, "Few-shot examples per task prompt (this project's key; GPT-NeoX always uses 0)."
    )

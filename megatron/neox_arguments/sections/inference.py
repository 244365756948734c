"""The text-generation and evaluation sections."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class TextGenerationArgs:
    """Sampling from a trained model (generate.py); samples are reproducible from `seed`."""

    text_gen_type: str | None = option(
        None,
        "Generation mode: unconditional, input-file or interactive; null means input-file when "
        "sample_input_file is set, else unconditional (args.derived.text_gen_type).",
    )
    sample_input_file: str | None = option(
        None, "Prompts file for input-file mode, prompts separated by prompt_end."
    )
    sample_output_file: str | None = option(
        None,
        "JSON-lines file the samples are written to (context, text, token ids, timing); null: "
        "<log_dir>/samples/samples.jsonl (log_dir unset: load's directory).",
    )
    num_samples: int = option(1, "Number of samples in unconditional mode.")
    maximum_tokens: int = option(
        64, "Most tokens generated per prompt; prompt + maximum_tokens must fit "
        "max_position_embeddings."
    )
    temperature: float = option(
        0.0, "Sampling temperature; 0 leaves the logits unscaled, and with top_k and top_p 0 "
        "picks the most likely token (GPT-NeoX's rule).")
    top_k: int = option(0, "Sample only among the k most likely tokens (0: no limit).")
    top_p: float = option(
        0.0, "Sample only among the most likely tokens whose probability sums to p (0: off)."
    )
    recompute: bool = option(
        False, "Recompute attention over the whole sequence each step instead of a KV cache."
    )
    prompt_end: str = option("\n", "Separator that ends each prompt in the input file.")
    stop_token_ids: list[int] | None = option(
        None, "Token ids that end a sample besides EOD (which always does); checked against "
        "the tokenizer."
    )
    stop_strings: list[str] | None = option(
        None, "Strings that end a sample; the text is cut before the first one found."
    )
    generation_batch_size: int = option(
        8, "Prompts generated together (left-padded to one length) by each model replica."
    )


@dataclass(frozen=True)
class EvalArgs:
    """Evaluation with lm-evaluation-harness (eval.py)."""

    eval_tasks: list[str] | None = option(
        None,
        "lm-evaluation-harness tasks to run: registry names, names defined in "
        "eval_include_path, paths to task YAML files, or directories of them. eval.py scores "
        "a checkpoint; train.py also scores the model at every evaluation (eval_interval).",
    )
    eval_results_prefix: str = option(
        "", "Prefix of the results file ({prefix}_eval_results_<date>.json); empty: "
        "<log_dir>/eval/eval_results_<date>.json (log_dir unset: load's directory)."
    )
    eval_num_fewshot: int = option(
        0, "Few-shot examples per task prompt (this project's key; GPT-NeoX always uses 0)."
    )
    eval_include_path: list[str] | None = option(
        None, "Directories of local lm-eval task YAMLs whose task names eval_tasks may use."
    )
    eval_batch_size: int = option(
        8, "Sequences scored together in one forward pass by each model replica."
    )
    eval_limit: int | float | None = option(
        None, "Documents per task, a whole number (below 1: that fraction of them, rounded up); "
        "null runs all. For smoke tests."
    )
    eval_cache_dir: str | None = option(
        None, "eval.py: keep the scores of finished log-likelihood requests and the texts of "
        "finished generate_until requests in a file here (one per checkpoint and scoring setup), "
        "written after every round of requests, so that an evaluation stopped part-way (SIGTERM, "
        "a crash) and run again does only the rest; null keeps nothing. Evaluation during "
        "training (train.py) keeps nothing."
    )
    eval_bootstrap_iters: int = option(
        100000, "Bootstrap resamples for the stderr of metrics without a closed form (lm-eval's "
        "default); 0 skips them."
    )

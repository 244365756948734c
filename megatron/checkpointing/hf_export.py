"""Exporting a checkpoint of any layout as a Hugging Face model directory (GPTNeoX, Llama,
Mixtral or Mamba), or in mamba_ssm's format (architecture "mamba_ssm", mamba_ssm_export.py).

    export_to_hf(Path("checkpoints/tiny/global_step200"), args, Path("hf/tiny"))

    <out>/config.json                 GPTNeoXConfig or LlamaConfig (hf_mapping picks the one that
                                      holds the model; one that none holds is refused, with why);
                                      a reward model (train_impl rm) is written as the
                                      ...ForSequenceClassification of one label, as GPT-NeoX does
    <out>/model.safetensors           the weights (sharded with an index when large)
    <out>/generation_config.json      bos = eos = the tokenizer's end-of-document id
    <out>/tokenizer.json              for tokenizers built on `tokenizers` (HFTokenizer,
    <out>/tokenizer_config.json       GPT2BPETokenizer, HFGPT2Tokenizer); others: a warning;
                                      with the chat template of the vocab_file's folder

The weights come from `reader.read_checkpoint`, every file verified first (any tensor/pipeline
degree, any ZeRO stage); the model and tokenizer come from the run config `args`, whose
architecture must agree with the checkpoint's own config.yml (for a checkpoint GPT-NeoX wrote,
the model keys of its saved configs). vocab_size stays the padded
vocabulary (every row the checkpoint embeds), so the HF logits equal ours column for column;
the tokenizer never produces the extra ids. Precision "auto" keeps the dtype the checkpoint's weights are stored in (fp32 for fp32
training, the bf16/fp16 module weights of mixed-precision runs); fp32/bf16/fp16 cast to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from megatron.checkpointing import neox_format
from megatron.checkpointing.layout import CONFIG_NAME
from megatron.checkpointing.locate import step_directory
from megatron.checkpointing.mamba_ssm_export import write_mamba_ssm
from megatron.checkpointing.model_shape import check_architecture
from megatron.checkpointing.reader import CheckpointWeights, read_checkpoint
from megatron.model.config import ModelConfig, model_config_from_args
from megatron.model.hf_mapping import architecture_for, hf_class_name, to_hf_model
from megatron.monitoring.logger import get_logger
from megatron.monitoring.progress import progress
from megatron.paths import check_writable

log = get_logger(__name__)

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAMBA_SSM = "mamba_ssm"  # the architecture name of mamba_ssm's format (mamba_ssm_export.py)


def current_umask() -> int:
    """This process's umask (reading it means setting it: it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_output_dir(step_dir: Path) -> Path:
    """Where an export goes when no output directory is given: `<save>/hf/global_step<N>`."""
    return step_dir.parent / "hf" / step_dir.name


def export_to_hf(step_dir: Path, args, output_dir: Path | None, architecture: str = "auto",
                 precision: str = "auto") -> Path:
    """Write the checkpoint `step_dir` (or the one `<save>/latest` names when given the save
    directory) as a Hugging Face model directory `output_dir` (None: `default_output_dir`);
    returns it."""
    from megatron.tokenizer import build_tokenizer

    if precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not known; valid: auto, "
                         f"{', '.join(PRECISIONS)}")
    step_dir = step_directory(Path(step_dir))
    mamba_ssm = architecture == MAMBA_SSM
    # refused before any weight is read (the vocabulary size plays no part in the choice)
    name = architecture_for(model_config_from_args(args, 1), "mamba" if mamba_ssm else architecture)
    tok = args.tokenizer
    tokenizer = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    output_dir = Path(output_dir) if output_dir is not None else default_output_dir(step_dir)
    check_writable("--output_dir", output_dir)  # before any weight is read
    with progress(total=3, desc="export to Hugging Face", unit="step") as bar:
        ck = read_step(step_dir, args)
        bar.update()
        config = exported_config(args, ck, tokenizer)
        dtype = ck.canonical["0.word_embeddings.weight"].dtype if precision == "auto" \
            else PRECISIONS[precision]
        if mamba_ssm:
            write_mamba_ssm(ck.canonical, config, output_dir, dtype)
            bar.update(2)
            log.info("wrote mamba_ssm's MambaLMHeadModel (%s) from %s to %s",
                     str(dtype).replace("torch.", ""), ck.step_dir, output_dir)
            return output_dir
        model = to_hf_model(ck.canonical, config, tokenizer.eod, architecture=name, dtype=dtype,
                            pad_token_id=tokenizer.pad)
        bar.update()
        save_hf_model(model, output_dir)
        write_hf_tokenizer(tokenizer, output_dir, config.max_position_embeddings,
                           chat_template_beside(tok.vocab_file))
        bar.update()
    log.info("wrote %s (%s) from %s to %s", hf_class_name(config, name),
             str(dtype).replace("torch.", ""), ck.step_dir, output_dir)
    return output_dir


def save_hf_model(model, output_dir: Path) -> None:
    """`model.save_pretrained` as safetensors, without transformers' own progress bar (ours
    covers the export), its files given the user's umask (safetensors writes them 0600)."""
    from transformers.utils import logging as hf_logging

    output_dir.mkdir(parents=True, exist_ok=True)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(output_dir, safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    for path in output_dir.glob("*.safetensors"):
        path.chmod(0o666 & ~current_umask())


def read_step_configs(step_dir: Path) -> list[Path]:
    """The config files the checkpoint was saved with (the default run config of an export):
    its config.yml, or the configs/*.yml GPT-NeoX saved beside its own checkpoints."""
    step = step_directory(step_dir)
    if (step / CONFIG_NAME).is_file():
        return [step / CONFIG_NAME]
    neox = sorted(p for p in (step / neox_format.CONFIG_DIR).glob("*.y*ml"))
    if neox:
        return neox
    raise FileNotFoundError(f"{step / CONFIG_NAME} is missing: the checkpoint does not record "
                            "its config; pass the training config files")


def read_step(step_dir: Path, args) -> CheckpointWeights:
    """The checkpoint's full weights (verified) and saved config."""
    return read_checkpoint(step_directory(step_dir), run_args=args)


def exported_config(args, ck, tokenizer) -> ModelConfig:
    """The ModelConfig of the run config, with the checkpoint's padded vocabulary; ValueError
    when it differs from the checkpoint's own architecture or the tokenizer does not fit."""
    trained = ck.trained_vocab
    ids = max(tokenizer.vocab_size, tokenizer.max_token_id + 1)
    if ids > trained:
        raise ValueError(f"the tokenizer ({args.tokenizer.tokenizer_type}, "
                         f"{args.tokenizer.vocab_file}) has {ids} ids but the checkpoint "
                         f"{ck.step_dir} embeds only {trained}: use the tokenizer the model was "
                         "trained with")
    config = model_config_from_args(args, trained)
    check_architecture(config, ck.saved_model_config(args, trained), ck.step_dir)
    return config


def chat_template_beside(vocab_file: str | None):
    """The chat template of the Hugging Face tokenizer directory holding `vocab_file` (its
    chat_template.jinja, else the `chat_template` of its tokenizer_config.json), or None."""
    if not vocab_file:
        return None
    folder = Path(vocab_file).parent
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return settings.get("chat_template") if isinstance(settings, dict) else None


def write_hf_tokenizer(tokenizer, output_dir: Path, max_length: int,
                       chat_template=None) -> bool:
    """tokenizer.json + tokenizer_config.json (a `PreTrainedTokenizerFast`: bos = eos = our
    end-of-document token, pad = ours, the chat template given) when the tokenizer is built on
    `tokenizers`; else a warning and False."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "tokenizer", None)
    if not isinstance(backend, Tokenizer):
        log.warning("%s has no Hugging Face tokenizer form: no tokenizer was written to %s; "
                    "add the tokenizer's files there yourself", tokenizer.name, output_dir)
        return False
    backend.save(str(output_dir / "tokenizer.json"))
    eos, pad = backend.id_to_token(tokenizer.eod), backend.id_to_token(tokenizer.pad)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos,
                "eos_token": eos, "pad_token": pad, "model_max_length": max_length,
                "clean_up_tokenization_spaces": False}
    if chat_template:
        settings["chat_template"] = chat_template
    (output_dir / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return True

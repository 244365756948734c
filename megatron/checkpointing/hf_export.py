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
the model keys of its saved configs). vocab_size stays the padded vocabulary (every row the
checkpoint embeds), so the HF logits equal ours column for column; the tokenizer never
produces the extra ids. Precision "auto" keeps the dtype the checkpoint's weights are stored in
(fp32 for fp32 training, the bf16/fp16 module weights of mixed-precision runs); fp32/bf16/fp16
cast to it.

The output directory is checked before any weight is read: never a checkpoint, a save directory
or the input directory (or inside a checkpoint), and not an existing non-empty directory unless
`overwrite`, which removes the earlier export's model files (EXPORT_FILES: weights, index, config
and tokenizer files) before the new ones are written, so that no stale shard, index or tokenizer
survives beside them (an export whose tokenizer has no Hugging Face form writes none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from megatron.checkpointing import neox_format
from megatron.checkpointing.layout import (CONFIG_NAME, LATEST, MANIFEST_NAME, iteration_of,
                                           saved_iterations, tag_for)
from megatron.checkpointing.locate import step_directory
from megatron.checkpointing.mamba_ssm_export import write_mamba_ssm
from megatron.checkpointing.model_shape import check_architecture
from megatron.checkpointing.reader import CheckpointWeights, read_checkpoint
from megatron.model.config import ModelConfig, model_config_from_args
from megatron.model.hf_mapping import architecture_for, export_notes, hf_class_name, to_hf_model
from megatron.monitoring.logger import get_logger
from megatron.monitoring.progress import progress
from megatron.neox_arguments import NeoXArgs
from megatron.paths import check_writable
from megatron.tokenizer.hf import PAD_TOKEN

log = get_logger(__name__)

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAMBA_SSM = "mamba_ssm"  # the architecture name of mamba_ssm's format (mamba_ssm_export.py)
# what an earlier export left that --overwrite removes: stale shards or an index naming them
# would otherwise be loaded by transformers beside (or instead of) the new weights, and a stale
# tokenizer by AutoTokenizer where the new export writes none (or other files)
EXPORT_FILES = ("model*.safetensors", "pytorch_model*.bin", "*.index.json", "config.json",
                "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
                "chat_template.jinja")


def current_umask() -> int:
    """This process's umask (reading it means setting it: it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_output_dir(step_dir: Path) -> Path:
    """Where an export goes when no output directory is given: `<save>/hf/global_step<N>`."""
    return step_dir.parent / "hf" / step_dir.name


def export_to_hf(input_dir: Path, args, output_dir: Path | None, architecture: str = "auto",
                 precision: str = "auto", *, iteration: int | None = None,
                 overwrite: bool = False, pad_token_id: int | None = None) -> Path:
    """Write the checkpoint `input_dir` (a global_step<N> directory, or a save directory's
    `iteration`, else the one its `latest` names) as a Hugging Face model directory
    `output_dir` (None: `default_output_dir`); returns it. `args` None: the checkpoint's own
    saved config. `pad_token_id` None: the tokenizer's pad (`export_padding`). Every refusal
    writes nothing."""
    if precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not known; valid: auto, "
                         f"{', '.join(PRECISIONS)}")
    step_dir = export_step_dir(Path(input_dir), iteration)
    saved = None if args is not None else read_step_configs(step_dir)
    args = args if saved is None else NeoXArgs.from_ymls(saved)
    output_dir = Path(output_dir) if output_dir is not None else default_output_dir(step_dir)
    check_output_dir(output_dir, step_dir, Path(input_dir), overwrite)
    mamba_ssm = architecture == MAMBA_SSM
    shape = model_config_from_args(args, 1)  # the vocabulary size plays no part in the choice
    check_mamba(shape, architecture)
    name = architecture_for(shape, "mamba" if mamba_ssm else architecture)
    for note in export_notes(shape, name):
        log.warning(note)
    tokenizer = export_tokenizer(args.tokenizer, saved)
    with progress(total=3, desc="export to Hugging Face", unit="step") as bar:
        ck = read_step(step_dir, args)
        bar.update()
        config = exported_config(args, ck, tokenizer)
        pad, pad_token = export_padding(tokenizer, args.tokenizer, config, pad_token_id)
        dtype = ck.canonical["0.word_embeddings.weight"].dtype if precision == "auto" \
            else PRECISIONS[precision]
        if overwrite:
            remove_earlier_export(output_dir)
        if mamba_ssm:
            write_mamba_ssm(ck.canonical, config, output_dir, dtype)
            bar.update(2)
            log.info("wrote mamba_ssm's MambaLMHeadModel (%s) from %s to %s",
                     str(dtype).replace("torch.", ""), ck.step_dir, output_dir)
            return output_dir
        model = to_hf_model(ck.canonical, config, tokenizer.eod, architecture=name, dtype=dtype,
                            pad_token_id=pad)
        bar.update()
        save_hf_model(model, output_dir)
        write_hf_tokenizer(tokenizer, output_dir, config.max_position_embeddings,
                           chat_template_beside(args.tokenizer.vocab_file), pad, pad_token)
        bar.update()
    log.info("wrote %s (%s) from %s to %s", hf_class_name(config, name),
             str(dtype).replace("torch.", ""), ck.step_dir, output_dir)
    return output_dir


def export_step_dir(input_dir: Path, iteration: int | None) -> Path:
    """The checkpoint --input_dir and --iteration name: `input_dir` itself when it is one (an
    `iteration` must be its own), else the save directory's `iteration` or `latest`."""
    input_dir = Path(input_dir)
    own = iteration_of(input_dir.name)
    one = input_dir.is_dir() and (own is not None or (input_dir / MANIFEST_NAME).is_file())
    if iteration is not None and one:
        if iteration != own:
            mine = f" (iteration {own})" if own is not None else ""
            raise ValueError(f"--iteration {iteration} disagrees with --input_dir {input_dir}"
                             f"{mine}, which is one checkpoint: give the save directory "
                             f"{input_dir.parent} with --iteration {iteration}, or "
                             f"{input_dir} without --iteration")
        iteration = None
    return step_directory(input_dir, iteration)


def is_checkpoint_dir(path: Path) -> bool:
    """Whether `path` holds a checkpoint: our manifest or GPT-NeoX's model states file (False
    where it cannot be read)."""
    try:
        return (path / MANIFEST_NAME).is_file() or (path / neox_format.model_file(0)).is_file()
    except OSError:
        return False


def is_save_dir(path: Path) -> bool:
    """Whether `path` is a directory training saves to: a `latest` file, or checkpoints (False
    where it cannot be read)."""
    try:
        return (path / LATEST).is_file() or any(is_checkpoint_dir(path / tag_for(i))
                                                for i in saved_iterations(path))
    except OSError:
        return False


def training_dir_reason(output_dir: Path, step_dir: Path, input_dir: Path) -> str | None:
    """Why `output_dir` is part of the checkpoint or save directory it must stay out of (the
    exported one, or any other); None when it is not. Inside a save directory is allowed
    (the default, <save>/hf/...) except under a global_step<N> name training would read."""
    out, step = output_dir.resolve(), step_dir.resolve()
    for d in (out, *out.parents):
        where = "is" if d == out else "is inside"
        if d == step or is_checkpoint_dir(d):
            return f"{where} the checkpoint directory {d}"
        if iteration_of(d.name) is not None and is_save_dir(d.parent):
            named = "is" if d == out else f"is inside {d}, which is"
            return (f"{named} named like a checkpoint of the save directory {d.parent} (training "
                    "would read it)")
    if is_save_dir(out):
        return f"is the save directory {out} (it holds '{LATEST}' or global_step<N> checkpoints)"
    if out == input_dir.resolve():
        return "is the input directory"
    return None


def check_output_dir(output_dir: Path, step_dir: Path, input_dir: Path, overwrite: bool) -> None:
    """Refuse an `output_dir` that is (or is inside) a checkpoint or save directory or is the
    input directory, or exists with files in it and `overwrite` is not given; or that cannot be
    written."""
    reason = training_dir_reason(output_dir, step_dir, input_dir)
    if reason:
        raise ValueError(f"--output_dir {output_dir} {reason}: Hugging Face files must not be "
                         "mixed with training files; choose a directory outside it (the "
                         f"default is {default_output_dir(step_dir)})")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"--output_dir {output_dir} exists and is not empty: pass "
                              "--overwrite to export into it (the model, weight and tokenizer "
                              "files of an earlier export there are removed first), or choose a "
                              "new directory")
    check_writable("--output_dir", output_dir)


def remove_earlier_export(output_dir: Path) -> None:
    """--overwrite: delete the EXPORT_FILES of an earlier export in `output_dir`, in one line."""
    stale = sorted({p for pattern in EXPORT_FILES for p in output_dir.glob(pattern)
                    if p.is_file()})
    for path in stale:
        path.unlink()
    if stale:
        log.info("--overwrite: removed %d file(s) of an earlier export from %s: %s", len(stale),
                 output_dir, ", ".join(p.name for p in stale))


def check_mamba(config: ModelConfig, architecture: str) -> None:
    """--architecture mamba / mamba_ssm is for Mamba models: ValueError for one with attention
    layers."""
    if architecture not in ("mamba", MAMBA_SSM):
        return
    attention = [i for i in range(config.num_layers) if not config.is_mamba_layer(i)]
    if not attention:
        return
    mixed = len(attention) < config.num_layers
    raise ValueError(
        f"--architecture {architecture}: the checkpoint is not a Mamba model (it has attention "
        f"layers" + (f": {', '.join(map(str, attention))} of its {config.num_layers})"
                     if mixed else ")")
        + f"; {architecture} export is for Mamba models"
        + (", of Mamba layers only (a model mixing Mamba and attention layers has no Hugging "
           "Face form)" if mixed else ": leave --architecture out (auto) to export this one"))


def export_tokenizer(tok, saved: list[Path] | None):
    """The tokenizer of the config section `tok`; a tokenizer file missing when the paths came
    from the checkpoint's `saved` config files is explained: where they came from, what to do."""
    from megatron.tokenizer import build_tokenizer

    try:
        return build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    except FileNotFoundError:
        missing = [(key, getattr(tok, key)) for key in ("vocab_file", "merge_file")
                   if getattr(tok, key) and not os.path.isfile(getattr(tok, key))]
        if saved is None or not missing:
            raise
    key, path = missing[0]
    advice = (f"pass --config_file with a config giving the right {key} (e.g. --config_file "
              f"{saved[-1]} plus a YAML file setting {key})")
    if not os.path.isabs(path):
        advice = (f"a relative path is read from the current directory, {os.getcwd()}: run the "
                  f"export from the directory training ran in, or {advice}")
    raise FileNotFoundError(f"{tok.tokenizer_type}: {key} {path} does not exist; it comes from "
                            f"the checkpoint's saved config ({', '.join(map(str, saved))}); "
                            f"{advice}")


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


def export_padding(tokenizer, tok, config: ModelConfig,
                   pad_token_id: int | None) -> tuple[int, str | None]:
    """The pad id of the export (`pad_token_id`, else the tokenizer's), and the token to add to
    the exported tokenizer for it (None: the tokenizer has it).

    A reward model is read by Hugging Face at the last token that is not padding, and trained
    to be read at the end-of-text token that closes the text: its pad must be another id. A
    tokenizer whose pad is its end-of-text token gets a PAD_TOKEN of its own, in the first row
    of the padded vocabulary, which no text produces; with no such row (or a tokenizer without
    a Hugging Face form) --pad_token_id must name an id the texts never contain."""
    backend = getattr(tokenizer, "tokenizer", None)
    ids = max(tokenizer.vocab_size, tokenizer.max_token_id + 1)
    which = f"the tokenizer ({tok.tokenizer_type}, {tok.vocab_file})"
    if pad_token_id is not None and not 0 <= pad_token_id < ids:
        raise ValueError(f"--pad_token_id {pad_token_id} is not an id of {which}: its ids are "
                         f"0-{ids - 1}")
    pad = tokenizer.pad if pad_token_id is None else pad_token_id
    if not config.value_head or pad != tokenizer.eod:
        return pad, None
    why = (f"the end-of-text id of {which}: Hugging Face reads a reward model at the last token "
           "that is not padding, which would be the token before the end-of-text token the "
           "model was trained to be read at")
    if pad_token_id is not None:
        raise ValueError(f"--pad_token_id {pad_token_id} is {why}; give an id the scored texts "
                         "never contain")
    from tokenizers import Tokenizer

    if not isinstance(backend, Tokenizer) or ids >= config.padded_vocab_size:
        raise ValueError(f"the pad id {pad} is {why}, and the checkpoint has no spare "
                         f"vocabulary row for a padding token of its own: pass --pad_token_id "
                         "with an id the scored texts never contain")
    log.info("the tokenizer pads with its end-of-text token (id %d): the reward model is "
             "exported with a padding token of its own, %s (id %d), so that Hugging Face reads "
             "it at the end-of-text token", pad, PAD_TOKEN, ids)
    return ids, PAD_TOKEN


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


def write_hf_tokenizer(tokenizer, output_dir: Path, max_length: int, chat_template=None,
                       pad_id: int | None = None, pad_token: str | None = None) -> bool:
    """tokenizer.json + tokenizer_config.json (a `PreTrainedTokenizerFast`: bos = eos = our
    end-of-document token, pad = `pad_id` (default ours), the chat template given) when the
    tokenizer is built on `tokenizers`; else a warning and False. `pad_token` is added as a
    special token first, taking the id `pad_id`."""
    from tokenizers import AddedToken, Tokenizer

    backend = getattr(tokenizer, "tokenizer", None)
    if not isinstance(backend, Tokenizer):
        log.warning("%s has no Hugging Face tokenizer form: no tokenizer was written to %s; "
                    "add the tokenizer's files there yourself", tokenizer.name, output_dir)
        return False
    pad_id = tokenizer.pad if pad_id is None else pad_id
    if pad_token is not None:
        backend = Tokenizer.from_str(backend.to_str())  # the run's tokenizer is left as it is
        backend.add_special_tokens([AddedToken(pad_token, special=True)])
        if backend.token_to_id(pad_token) != pad_id:
            raise ValueError(f"{pad_token} took id {backend.token_to_id(pad_token)} in the "
                             f"exported tokenizer, not {pad_id}")
    backend.save(str(output_dir / "tokenizer.json"))
    eos, pad = backend.id_to_token(tokenizer.eod), backend.id_to_token(pad_id)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos,
                "eos_token": eos, "pad_token": pad, "model_max_length": max_length,
                "clean_up_tokenization_spaces": False}
    if chat_template:
        settings["chat_template"] = chat_template
    (output_dir / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return True

"""Importing a local Hugging Face GPTNeoX, Llama, Mixtral or Mamba model directory as a
weights-only checkpoint.

    import_from_hf(Path("hf/pythia-160m"), args, Path("checkpoints/pythia"), tp=2, iteration=0)

Reads only the local directory (nothing is downloaded): config.json and the weights, from the
first of model.safetensors, model.safetensors.index.json (shards), pytorch_model.bin,
pytorch_model.bin.index.json that exists. hf_mapping turns them into our canonical weights;
the run config `args` must describe the same model (each differing key is named with both
values). HF's vocab_size may be smaller than the config's padded vocabulary (the tokenizer's
size rounded up for make_vocab_size_divisible_by and tp): the embedding and LM head then get
zero rows; larger is refused. The tensors keep the dtype of the HF files. The checkpoint is
written by weights_only.write_weights_checkpoint. Every refusal that does not need the weights
(options, config, an output directory that cannot be written or already holds this or a later
iteration) comes before any weight is read; a damaged weight file is named.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from megatron.model.config import ModelConfig, model_config_from_args
from megatron.checkpointing.model_shape import FIELD_LABELS, compared_fields, field_text
from megatron.monitoring.logger import get_logger
from megatron.paths import check_writable

log = get_logger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# how the config spells a ModelConfig field, where it differs
_CONFIG_KEYS = {"tied_embeddings": "tied embeddings (no_weight_tying false)",
                "norm_epsilon": "norm epsilon (layernorm_epsilon / rms_norm_epsilon)",
                **FIELD_LABELS}


def import_from_hf(hf_dir: Path, args, save_dir: Path, tp: int | None = None,
                   iteration: int = 0) -> Path:
    """Write the HF model in `hf_dir` as `<save_dir>/global_step<iteration>/` for `tp`
    tensor-parallel ranks (default: the config's model_parallel_size); returns that path."""
    from megatron.checkpointing.weights_only import (check_new_iteration, config_for_tp,
                                                     write_weights_checkpoint)
    from megatron.model.hf_mapping import canonical_from_hf, hf_model_config, import_notes
    from megatron.checkpointing.reader import resize_vocab

    if tp is not None and tp < 1:
        raise ValueError(f"--tp {tp} must be at least 1 (the tensor-parallel degree to split "
                         "for; leave --tp out for the config's model_parallel_size)")
    hf_dir, save_dir = Path(hf_dir), Path(save_dir)
    hf_cfg = read_hf_config(hf_dir)
    _, hf_model = hf_model_config(hf_cfg)  # refused here, before any weight is read
    if tp is not None:
        args = config_for_tp(args, tp)
    config, tokenizer_ids = _run_config(args)
    check_same_model(config, hf_model, tokenizer_ids, hf_dir)
    for note in import_notes(hf_cfg, config, args.derived.precision):
        log.warning("%s: %s", hf_dir / "config.json", note)
    check_writable("--output_dir", save_dir)  # before any weight is read
    check_new_iteration(save_dir, iteration)
    canonical, _ = canonical_from_hf(read_hf_weights(hf_dir), hf_cfg)
    canonical = resize_vocab(canonical, config.num_layers, config.padded_vocab_size)
    return write_weights_checkpoint(save_dir, iteration, canonical, args,
                                    args.parallelism.model_parallel_size)


def read_hf_config(hf_dir: Path):
    """The HF config of a local model directory; FileNotFoundError naming what is missing."""
    from transformers import AutoConfig

    if hf_dir.is_file():
        raise NotADirectoryError(f"--hf_model {hf_dir} is a file; give the Hugging Face model "
                                 f"directory that holds it ({hf_dir.parent})")
    if not hf_dir.is_dir():
        raise FileNotFoundError(f"Hugging Face model directory {hf_dir} does not exist (only "
                                "local directories are read; nothing is downloaded)")
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {hf_dir} is not a Hugging Face model "
                                "directory (save one with model.save_pretrained(dir))")
    try:
        return AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"cannot read {path} as a Hugging Face config: {err}") from err


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model in `hf_dir` (safetensors or pytorch_model.bin, sharded or not)."""
    found = next((hf_dir / n for n in WEIGHT_FILES if (hf_dir / n).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{hf_dir} holds no weights: expected one of "
                                f"{', '.join(WEIGHT_FILES)}")
    files = [found]
    if found.name.endswith(".index.json"):
        files = [hf_dir / name for name in sorted(set(_weight_map(found).values()))]
    state: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing ({found.name} lists it)")
        state.update(_load_weights(path))
    return state


def _weight_map(index: Path) -> dict[str, str]:
    """HF tensor name -> shard file name, from a sharded model's index file."""
    try:
        return dict(json.loads(index.read_text())["weight_map"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{index} is damaged or incomplete (not JSON with a weight_map: "
                         f"{err}); re-download it or re-save the model") from err


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one weight file; ValueError naming the file when it cannot be read
    (truncated by an interrupted download or copy, or not a weight file at all)."""
    from safetensors import SafetensorError

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        reason = str(err).strip().split("\n")[0].split(". ")[0] or type(err).__name__
        raise ValueError(f"{path} is damaged or incomplete ({reason}); re-download it or "
                         "re-save the model") from err


def _run_config(args) -> tuple[ModelConfig, int]:
    """(the config's ModelConfig with its padded vocabulary, ids of its tokenizer)."""
    from megatron.neox_arguments import padded_vocab_size
    from megatron.tokenizer import build_tokenizer

    tok = args.tokenizer
    tokenizer = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    padded = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by,
                               args.parallelism.model_parallel_size)
    ids = max(tokenizer.vocab_size, tokenizer.max_token_id + 1)
    return model_config_from_args(args, padded), ids


def check_same_model(config: ModelConfig, hf_model: ModelConfig, tokenizer_ids: int,
                     hf_dir: Path) -> None:
    """ValueError naming every architecture key where the config and the HF model differ."""
    where = hf_dir / "config.json"
    problems = [f"{_CONFIG_KEYS.get(name, name)}: {field_text(name, getattr(config, name))} in "
                f"the config vs {field_text(name, getattr(hf_model, name))} in {where}"
                for name in compared_fields(config, hf_model)
                if getattr(config, name) != getattr(hf_model, name)]
    rows, padded = hf_model.padded_vocab_size, config.padded_vocab_size
    if rows > padded:
        problems.append(f"vocabulary: {where} has vocab_size {rows} but the config pads its "
                        f"tokenizer's vocabulary only to {padded} rows")
    if tokenizer_ids > rows:
        problems.append(f"vocabulary: the config's tokenizer has {tokenizer_ids} ids but the "
                        f"model in {hf_dir} embeds only {rows}")
    if problems:
        raise ValueError(f"the config does not describe the Hugging Face model in {hf_dir}: "
                         + "; ".join(problems) + ". Use a config with the model's architecture "
                         "and tokenizer")

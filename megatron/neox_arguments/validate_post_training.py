"""A15 for post-training: the training objective (`train_impl`), the kind of dataset and the files
it reads agree. Each rule names the keys, their values and what to change.

    train_impl  dataset_impl  data keys                                       pack_impl
    normal      gpt2          data_path or *_data_paths [+ *_label_data_paths] any
    kto         gpt2          *_data_paths + *_reward_data_paths [+ labels]   not packed
    dpo, rm     pairwise      pos_*/neg_*_data_paths [+ their label files]    not packed
"""

from __future__ import annotations

from typing import Any, Mapping

from .errors import BadValue, Problems
from .registries import REGISTRIES

Config = Mapping[str, Any]
SPLITS = ("train", "valid", "test")
PAIRED_OBJECTIVES = ("dpo", "rm")


# the settings only one objective reads; another objective would silently leave them unused
OBJECTIVE_KEYS = {"dpo_beta": "dpo", "dpo_fp32": "dpo", "dpo_reference_free": "dpo",
                  "kto_beta": "kto", "kto_fp32": "kto", "kto_desirable_weight": "kto",
                  "kto_undesirable_weight": "kto", "z_loss": "rm"}


def needs_reference(training) -> bool:
    """Whether the objective compares the policy with a reference model (the `training`
    section): DPO unless reference-free, and KTO."""
    return training.train_impl == "kto" or (training.train_impl == "dpo"
                                            and not training.dpo_reference_free)


def no_reference_message(impl: str, why: str = "no checkpoint was loaded") -> str:
    free = " or dpo_reference_free: true" if impl == "dpo" else ""
    return (f"train_impl {impl} compares the policy with a reference model, the model training "
            f"starts from, but {why}: set load (with finetune: true) to the model to "
            f"fine-tune{free}")


def post_training_rules(c: Config, world_size: int | None) -> Problems:
    yield from _parallel_lists(c)
    if c["train_impl"] in REGISTRIES["train_impl"].names:  # another is refused as a choice
        yield from _settings_of_other_objectives(c)
        yield from _every_split_alike(c)
        yield from _objective_and_dataset(c)
    yield from _coefficients(c)


def _settings_of_other_objectives(c: Config) -> Problems:
    """A setting of one objective changed from its default in a run of another: refused by
    name rather than left unused."""
    from .load import FIELD_DEFAULTS

    for key, owner in OBJECTIVE_KEYS.items():
        if c[key] != FIELD_DEFAULTS[key] and c["train_impl"] != owner:
            yield (f"{key}({c[key]}) is read by train_impl {owner} only, and this run's "
                   f"train_impl is {c['train_impl']}: remove it, or set train_impl: {owner}.")
    impl = c["train_impl"]
    if c["reference_load"] is not None and not (impl == "kto" or (
            impl == "dpo" and not c["dpo_reference_free"])):
        what = "dpo with dpo_reference_free: true" if impl == "dpo" else f"train_impl {impl}"
        yield (f"reference_load({c['reference_load']}) is read where a reference model is: "
               f"train_impl dpo (not reference-free) and kto, and this run is {what}: remove "
               "it.")


def _every_split_alike(c: Config) -> Problems:
    """Label files for one split, then for every split that has data: validation and test
    losses over every token would not compare with a training loss over the labelled ones.
    Rewards (KTO) for every split that has data: its evaluation reads them."""
    for data, side, what in (("{}_data_paths", "{}_label_data_paths", "label"),
                             ("pos_{}_data_paths", "pos_{}_label_data_paths", "label")):
        given = [s for s in SPLITS if c[side.format(s)] is not None]
        missing = [s for s in SPLITS if c[data.format(s)] is not None and s not in given]
        if given and missing:
            key = side.format(missing[0])
            yield (f"{side.format(given[0])} is set but {key} is not: {missing[0]} losses would "
                   f"count every token, the {given[0]} loss only the labelled ones; set {key} "
                   f"(the {what} files written beside its data), or remove the label files of "
                   "every split.")
    if c["train_impl"] == "kto" and c["train_reward_data_paths"] is not None:
        for split in SPLITS[1:]:
            if c[f"{split}_data_paths"] is not None and c[f"{split}_reward_data_paths"] is None:
                yield (f"train_impl kto reads a reward per document in every split, but "
                       f"{split}_data_paths has no {split}_reward_data_paths; set them (the "
                       "reward files preprocess_data_with_chat_template.py --reward-key wrote "
                       "beside its data).")


def _count(value) -> str:
    return "no" if value is None else str(len(value))


def _parallel_lists(c: Config) -> Problems:
    """Label, reward and neg files pair with their data files by position: one each."""
    for split in SPLITS:
        for base, extra, what in (
            (f"{split}_data_paths", f"{split}_label_data_paths", "label file"),
            (f"{split}_data_paths", f"{split}_reward_data_paths", "reward file"),
            (f"pos_{split}_data_paths", f"neg_{split}_data_paths", "rejected-response file"),
            (f"pos_{split}_data_paths", f"pos_{split}_label_data_paths", "label file"),
            (f"neg_{split}_data_paths", f"neg_{split}_label_data_paths", "label file"),
        ):
            paths, extras = c[base], c[extra]
            if extras is not None and (paths is None or len(extras) != len(paths)):
                yield (f"{extra} has {len(extras)} entries but {base} has {_count(paths)}; give "
                       f"one {what} per {base} entry, in the same order.")
        if c[f"pos_{split}_data_paths"] is not None and c[f"neg_{split}_data_paths"] is None:
            yield (f"pos_{split}_data_paths needs neg_{split}_data_paths: one rejected-response "
                   "file per chosen-response file.")
        labels = (c[f"pos_{split}_label_data_paths"], c[f"neg_{split}_label_data_paths"])
        if (labels[0] is None) != (labels[1] is None):
            yield (f"pos_{split}_label_data_paths and neg_{split}_label_data_paths must be given "
                   "together (or neither: every token of both carries loss).")
    given = [c[f"pos_{s}_data_paths"] is not None for s in SPLITS]
    if any(given) and not all(given):
        yield ("pos_train_data_paths, pos_valid_data_paths and pos_test_data_paths (and their neg_ "
               "files) must be given together.")


def _objective_and_dataset(c: Config) -> Problems:
    impl, kind, pack = c["train_impl"], c["dataset_impl"], c["pack_impl"]
    plain = [k for k in ("data_path", "train_data_paths") if c[k] is not None]
    pairs = c["pos_train_data_paths"] is not None
    side_files = [f"{s}_{k}_data_paths" for s in SPLITS for k in ("label", "reward")
                  if c[f"{s}_{k}_data_paths"] is not None]
    if side_files and c["data_path"] is not None:
        yield (f"{side_files[0]} pairs label and reward files with train/valid/test_data_paths; "
               "data_path cannot carry them: name each split's files in *_data_paths instead.")
    if kind == "pairwise":
        if not pairs:
            yield ("dataset_impl pairwise reads chosen/rejected pairs: set pos_train_data_paths "
                   "and neg_train_data_paths (and the valid/test ones).")
        if plain:
            yield (f"dataset_impl pairwise reads pos_*/neg_* paths, not {plain[0]}; remove it.")
        if pack == "packed":
            yield ("pack_impl packed cuts documents across samples, which would misalign chosen "
                   "and rejected responses; use pack_impl unpacked or pack_until_overflow with "
                   "dataset_impl pairwise.")
    elif pairs:
        yield "pos_*/neg_* data paths are read with dataset_impl: pairwise; set it."
    if impl in PAIRED_OBJECTIVES and kind != "pairwise":
        yield (f"train_impl {impl} trains on chosen/rejected pairs: set dataset_impl: pairwise "
               "with pos_*/neg_* data paths.")
    if impl not in PAIRED_OBJECTIVES and kind == "pairwise":
        yield (f"dataset_impl pairwise is for train_impl dpo or rm, not {impl}.")
    rewards = c["train_reward_data_paths"] is not None
    if impl == "kto":
        if not rewards:
            yield ("train_impl kto needs a reward per document: set train_reward_data_paths (and "
                   "the valid/test ones) beside train_data_paths (preprocess_data_with_chat_"
                   "template.py --reward-key).")
        if pack == "packed":
            yield ("train_impl kto rewards whole documents, which pack_impl packed cuts across "
                   "samples; use pack_impl unpacked or pack_until_overflow.")
    else:
        for split in SPLITS:
            if c[f"{split}_reward_data_paths"] is not None:
                yield (f"{split}_reward_data_paths are read by train_impl kto only, not {impl}; "
                       "remove them.")
                break


def _coefficients(c: Config) -> Problems:
    for key in ("dpo_beta", "kto_beta"):
        if not c[key] > 0:
            yield BadValue(key, f"{key}({c[key]}) must be > 0.")
    for key in ("kto_desirable_weight", "kto_undesirable_weight", "z_loss"):
        if not c[key] >= 0:
            yield BadValue(key, f"{key}({c[key]}) must be >= 0.")

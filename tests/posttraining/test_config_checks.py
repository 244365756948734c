"""Bad post-training input is refused before training starts, in one line naming the key or
the files and what to do: at config time (the objective, the kind of dataset and the files they
read) and in deepy.py before any worker starts (files that do not belong together, no model to
start from)."""

from __future__ import annotations

import pytest

from megatron.neox_arguments import ConfigError, NeoXArgs
from megatron.preflight import preflight
from tests.posttraining.runs import data_overrides
from tests.runs import ROOT, deepy, free_port

TINY = ROOT / "configs" / "tiny.yml"
PAIRS = {"dataset_impl": "pairwise", "pack_impl": "unpacked", "data_path": None,
         **{f"{side}_{split}_data_paths": [f"{side}_{split}"] for side in ("pos", "neg")
            for split in ("train", "valid", "test")}}


def refused(**overrides) -> str:
    with pytest.raises(ConfigError) as err:
        NeoXArgs.from_ymls([TINY], overrides)
    return str(err.value)


@pytest.mark.parametrize("overrides, message", [
    ({"train_impl": "dpo"}, "train_impl dpo trains on chosen/rejected pairs: set dataset_impl: "
                            "pairwise with pos_*/neg_* data paths"),
    ({**PAIRS, "train_impl": "dpo", "pack_impl": "packed"},
     "pack_impl packed cuts documents across samples, which would misalign chosen and rejected"),
    ({**PAIRS, "train_impl": "normal"}, "dataset_impl pairwise is for train_impl dpo or rm, not "
                                        "normal"),
    ({"train_impl": "kto", "pack_impl": "unpacked"}, "train_impl kto needs a reward per "
                                                     "document: set train_reward_data_paths"),
    ({"train_impl": "kto", "pack_impl": "packed", "data_path": None,
      **{f"{s}_{k}_data_paths": [s] for s in ("train", "valid", "test") for k in ("", "reward")
         if k}, **{f"{s}_data_paths": [s] for s in ("train", "valid", "test")}},
     "train_impl kto rewards whole documents, which pack_impl packed cuts across samples"),
    ({"data_path": None, **{f"{s}_data_paths": [s, s + "2"] for s in ("train", "valid", "test")},
      "train_label_data_paths": ["only_one"]},
     "train_label_data_paths has 1 entries but train_data_paths has 2; give one label file per "
     "train_data_paths entry, in the same order"),
    ({"train_label_data_paths": ["x"]}, "train_label_data_paths pairs label and reward files with "
                                        "train/valid/test_data_paths; data_path cannot carry them"),
    ({**PAIRS, "train_impl": "rm", "pos_train_label_data_paths": ["l"]},
     "pos_train_label_data_paths and neg_train_label_data_paths must be given together"),
    ({**PAIRS, "train_impl": "dpo", "dpo_beta": 0}, "dpo_beta(0.0) must be > 0"),
    ({"train_impl": "reinforce"}, "train_impl 'reinforce' is a GPT-NeoX choice this project does "
                                  "not support yet; choose one of: normal, dpo, kto, rm"),
    ({"data_path": None, **{f"{s}_data_paths": [s] for s in ("train", "valid", "test")},
      "train_label_data_paths": ["l"]},
     "train_label_data_paths is set but valid_label_data_paths is not: valid losses would count "
     "every token, the train loss only the labelled ones; set valid_label_data_paths"),
    ({**PAIRS, "train_impl": "dpo", "pos_train_label_data_paths": ["l"],
      "neg_train_label_data_paths": ["l"]},
     "pos_train_label_data_paths is set but pos_valid_label_data_paths is not"),
    ({"train_impl": "kto", "pack_impl": "unpacked", "data_path": None,
      **{f"{s}_data_paths": [s] for s in ("train", "valid", "test")},
      "train_reward_data_paths": ["r"], "test_reward_data_paths": ["r"]},
     "train_impl kto reads a reward per document in every split, but valid_data_paths has no "
     "valid_reward_data_paths"),
    ({"dpo_beta": 0.5}, "dpo_beta(0.5) is read by train_impl dpo only, and this run's "
                        "train_impl is normal: remove it, or set train_impl: dpo"),
    ({**PAIRS, "train_impl": "rm", "kto_desirable_weight": 3},
     "kto_desirable_weight(3.0) is read by train_impl kto only, and this run's train_impl is rm"),
    ({"data_path": None, **{f"{s}_data_paths": [s] for s in ("train", "valid", "test")},
      "valid_reward_data_paths": ["r"]},
     "valid_reward_data_paths are read by train_impl kto only, not normal; remove them"),
    ({"reference_load": "ckpt/sft"}, "reference_load(ckpt/sft) is read where a reference model "
     "is: train_impl dpo (not reference-free) and kto, and this run is train_impl normal: "
     "remove it."),
    ({**PAIRS, "train_impl": "dpo", "dpo_reference_free": True, "reference_load": "sft"},
     "and this run is dpo with dpo_reference_free: true: remove it."),
])
def test_the_config_refuses_an_objective_without_its_data(overrides, message):
    assert message in refused(**overrides)


def args_for(chat_files, impl: str, **extra) -> NeoXArgs:
    values = {"vocab_file": chat_files.vocab_file, "tokenizer_type": "HFTokenizer",
              "seq_length": 64, "max_position_embeddings": 64, "pack_impl": "unpacked",
              "data_path": None, **data_overrides(chat_files, impl), **extra}
    return NeoXArgs.from_ymls([TINY], values)


def test_files_that_do_not_belong_together_are_refused_before_workers_start(chat_files):
    other_labels = chat_files.sft["test"][1]  # 32 documents, the train split has 256
    with pytest.raises(ValueError, match=r"label file .*sft_test_messages_label_document.idx and "
                                         r"token file .*sft_train_messages_document.idx do not "
                                         r"belong together: 32 vs 256 documents"):
        preflight(args_for(chat_files, "normal", train_label_data_paths=[other_labels]),
                  "train.py")
    with pytest.raises(ValueError, match=r"chosen-response file .*dpo_train_chosen_document.idx "
                                         r"has 256 documents but rejected-response file "
                                         r".*dpo_test_rejected_document.idx has 32"):
        preflight(args_for(chat_files, "dpo", load="somewhere",
                           neg_train_data_paths=[chat_files.pairs["test"][2]],
                           neg_train_label_data_paths=[chat_files.pairs["test"][3]]), "train.py")


def test_dpo_and_kto_need_a_model_to_start_from(chat_files, tmp_path):
    with pytest.raises(ValueError, match="train_impl dpo compares the policy with a reference "
                                         "model.*set load \\(with finetune: true\\) to the model "
                                         "to fine-tune or dpo_reference_free: true"):
        preflight(args_for(chat_files, "dpo", load=None), "train.py")
    preflight(args_for(chat_files, "dpo", load=None, dpo_reference_free=True, save=None),
              "train.py")
    empty = tmp_path / "no_checkpoints_here"  # a directory holding none
    empty.mkdir()
    with pytest.raises(ValueError, match=rf"^train_impl kto compares the policy with a reference "
                                         rf"model, the model training starts from, but {empty} "
                                         r"holds no checkpoint: set load"):
        preflight(args_for(chat_files, "kto", load=str(empty), finetune=True), "train.py")


def test_reference_load_on_a_dpo_run_that_starts_is_refused_before_workers_start(chat_files,
                                                                                sft_run):
    """A fine-tune's reference model is the checkpoint it loads; reference_load only repoints
    the reference a resumed run recorded."""
    with pytest.raises(ValueError, match=r"^reference_load\(/elsewhere\) points to where a resumed"
                                         r" run's reference checkpoint has moved, but this run "
                                         r"records none: it starts"):
        preflight(args_for(chat_files, "dpo", load=str(sft_run / "ckpt"), finetune=True,
                           reference_load="/elsewhere", save=None), "train.py")


def test_a_reward_model_starts_from_a_language_model_only_as_a_fine_tune(chat_files, sft_run,
                                                                        tmp_path):
    """Through deepy.py: one line, before any worker starts."""
    over = {**{"vocab_file": chat_files.vocab_file, "tokenizer_type": "HFTokenizer",
               "seq_length": 64, "max_position_embeddings": 64, "pack_impl": "unpacked",
               "data_path": "null", "save": tmp_path / "rm", "master_port": free_port()},
            **data_overrides(chat_files, "rm"), "load": sft_run / "ckpt"}
    proc = deepy("train.py", str(TINY), *[f"{k}={v}" for k, v in over.items()])
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: checkpoint {sft_run / 'ckpt' / 'global_step60'} is a language "
                      "model; a reward model starts from one with finetune: true (its LM head "
                      "is left out and the value head starts fresh)"], proc.stderr[-2000:]
    assert "launching" not in proc.stderr

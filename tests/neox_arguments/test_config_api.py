"""NeoXArgs as other modules use it: sections, flat names, immutability, save/reload, encoding."""

from __future__ import annotations

import dataclasses
import json

import pytest

from neox_args_helpers import REPO, make

from megatron.neox_arguments import ConfigError, NeoXArgs
from megatron.neox_arguments.sections import FIELD_SECTION, SECTIONS


@pytest.fixture(scope="module")
def args():
    return NeoXArgs.from_ymls(
        [REPO / "configs/125M.yml", REPO / "configs/local_setup.yml"], ["train_iters=100"]
    )


def test_sections_and_flat_names(args):
    assert list(SECTIONS) == [
        "model", "parallelism", "optimizer", "lr_schedule", "training", "data", "tokenizer",
        "checkpoint", "logging", "text_generation", "eval", "launcher", "deepspeed",
    ]
    assert args.model.hidden_size == args.hidden_size == 768
    assert args.training.train_iters == args.train_iters == 100
    assert args.data_parallel_size == args.derived.data_parallel_size == 1
    assert args.optimizer.lr == args.lr == 0.0006 and args.zero_stage == 1
    # a user key wins over a derived value of the same name
    assert args.train_batch_size is None and args.derived.train_batch_size == 4
    # keys that share a section's name are reached with get()
    assert args.get("optimizer")["type"] == "Adam" and args.get("launcher") == "pdsh"
    with pytest.raises(AttributeError, match="Did you mean: hidden_size"):
        args.hiden_size  # noqa: B018


def test_every_field_has_a_doc_and_is_reachable(args):
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            doc = f.metadata["doc"]
            assert doc and "\n" not in doc and doc.endswith("."), f.name
            assert args.get(f.name) == getattr(getattr(args, name), f.name)
            if f.name not in SECTIONS:  # `optimizer` and `launcher` name sections first
                assert getattr(args, f.name) == args.get(f.name)
    assert len(FIELD_SECTION) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values())


def test_args_are_immutable(args):
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.train_iters = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.model.hidden_size = 5
    args.to_dict()["optimizer"]["params"]["lr"] = 1.0
    assert args.lr == 0.0006


def test_to_dict_is_flat_and_json_serialisable(args):
    d = args.to_dict()
    assert set(d) == set(FIELD_SECTION)
    assert d["hidden_size"] == 768 and d["zero_optimization"]["stage"] == 1
    assert json.loads(json.dumps(d)) == d


def test_saved_yaml_reloads_equal(args, tmp_path):
    path = tmp_path / "ckpt" / "config.yml"
    args.save_yml(path)
    text = path.read_text()
    assert "# --- model ---" in text and 'prompt_end: "\\n"' in text
    again = NeoXArgs.from_yml_saved(path)
    assert again == args and again.to_dict() == args.to_dict()
    assert again.derived == args.derived


def test_encode_decode_round_trip(args):
    text = args.encode()
    assert text.isascii() and " " not in text and len(text) < 4000
    assert NeoXArgs.decode(text) == args
    worker = NeoXArgs.decode(args.with_world_size(4).encode())
    assert worker.derived.world_size == 4
    with pytest.raises(ConfigError, match="Cannot decode the config string"):
        NeoXArgs.decode("not-a-config")


def test_replace_returns_a_new_validated_object(args):
    smaller = args.replace(num_layers=2, **{"train-iters": 7})
    assert (smaller.num_layers, smaller.train_iters, args.num_layers) == (2, 7, 12)
    assert smaller != args
    assert "num_layers: 12 (current config) -> 2 (replace())" in smaller.overrides_log
    with pytest.raises(ConfigError, match=r"hidden_size\(770\) % num_attention_heads\(12\)"):
        args.replace(hidden_size=770)


def test_equality_ignores_derived_and_log():
    a, b = make(), make().with_world_size(2)
    assert a == b and a.derived != b.derived

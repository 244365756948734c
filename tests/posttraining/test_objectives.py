"""Each training objective's loss, checked two ways on the same log-probabilities:

- against a hand computation on a tiny case (the formulas of the objectives' docstrings);
- against an independent implementation, TRL's trainers (a test-only dependency), fed the same
  token ids and completion masks with Hugging Face models holding the same weights as ours:
  DPOTrainer, KTOTrainer (given the batch's own sequences for its KL estimate, the reference
  point this project takes) and RewardTrainer (a sequence classifier read at the position ours
  reads).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from megatron.training.objectives import BatchOptions
from megatron.training.objectives.common import last_in_segment, segment_sums, shift
from megatron.training.objectives.dpo import DPO, dpo_loss
from megatron.training.objectives.kto import KTO, kto_loss
from megatron.training.objectives.lm import LanguageModel
from megatron.training.objectives.rm import RewardModel, reward_model_loss

M = -100
OPTIONS = BatchOptions(eod_token=0)


def test_dpo_by_hand():
    loss, m = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                       torch.tensor([-2.0]), beta=0.5)
    assert math.isclose(loss.item(), -math.log(1 / (1 + math.exp(-1.0))), rel_tol=1e-6)
    assert math.isclose(m["chosen_rewards"].item(), 0.5) and math.isclose(
        m["rejected_rewards"].item(), -0.5)
    assert m["margins"].item() == 1.0 and m["reward_acc"].item() == 1.0
    # the policy's own sums, and only the pairs that exist (the second is padding)
    _, m = dpo_loss(torch.tensor([-1.0, -9.0]), torch.tensor([-3.0, -9.0]), torch.zeros(2),
                    torch.zeros(2), beta=0.5, valid=torch.tensor([True, False]))
    assert (m["chosen_logps"].item(), m["rejected_logps"].item(), m["pairs"].item()) == \
        (-1.0, -3.0, 1.0)


def test_kto_by_hand():
    # ratios 1 (desirable) and -3 (undesirable): z = mean = -1, clamped to 0
    loss, m = kto_loss(torch.tensor([1.0, -3.0]), torch.tensor([1.0, -1.0]),
                       torch.tensor([True, True]), beta=0.5, desirable_weight=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = (2.0 * (1 - sig(0.5 * 1.0)) + 1.0 * (1 - sig(0.5 * 3.0))) / 2
    assert math.isclose(loss.item(), want, rel_tol=1e-6) and m["kto_kl"].item() == 0.0
    # ratios 2 and 0: z = 1
    loss, m = kto_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, -1.0]),
                       torch.tensor([True, True]), beta=1.0)
    assert m["kto_kl"].item() == 1.0
    assert math.isclose(loss.item(), ((1 - sig(1.0)) + (1 - sig(1.0))) / 2, rel_tol=1e-6)


def test_reward_model_by_hand():
    loss, m = reward_model_loss(torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.0]), z_loss=0.1)
    want = (-F.logsigmoid(torch.tensor(1.0)) - F.logsigmoid(torch.tensor(-0.5))).item() / 2 \
        + 0.1 * ((4 + 1) + (0.25 + 1)) / 2
    assert math.isclose(loss.item(), want, rel_tol=1e-6)
    assert m["accuracy"].item() == 0.5 and math.isclose(m["margin"].item(), 0.25)


def test_segments_score_each_document_of_a_packed_sample_on_its_own():
    # one row, two documents: tokens 5 6 7 | 8 9, labels on 6 7 and 9
    text = torch.tensor([[5, 6, 7, 8, 9, 1]])
    label = torch.tensor([[M, 6, 7, M, 9, M]])
    segment = torch.tensor([[0, 0, 0, 1, 1, -1]])
    s = shift(text, OPTIONS, label, segment)
    assert s.loss_mask.tolist() == [[1, 1, 0, 1, 0]] and s.segments.tolist() == [[0, 0, 1, 1, -1]]
    values = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0]])
    sums, present = segment_sums(values, s.loss_mask, s.segments)
    assert sums.tolist() == [[3.0, 8.0]] and present.tolist() == [[True, True]]
    last, _ = last_in_segment(values, s.loss_mask, s.segments)
    assert last.tolist() == [[2.0, 8.0]]
    reset = shift(text, BatchOptions(0, reset_position_ids=True, reset_attention_mask=True),
                  label, segment)
    assert reset.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert not reset.mask[0, 0, 3, 2] and reset.mask[0, 0, 4, 3]  # no attention across documents


def test_the_sft_loss_is_the_mean_over_supervised_positions():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 11, requires_grad=True)
    text = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    label = torch.tensor([[M, M, 3, 4, 5], [M, 7, M, M, 10]])
    inputs, targets = LanguageModel(supervised=True).prepare({"text": text, "label": label},
                                                             OPTIONS)
    loss, m = LanguageModel(supervised=True).loss(logits, targets)
    want = F.cross_entropy(logits.reshape(-1, 11), label[:, 1:].reshape(-1), ignore_index=M)
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-6) and m["supervised_tokens"] == 5


# -- TRL -------------------------------------------------------------------------------------

def _hf_pair(seed: int, vocab: int, value_head: bool = False, pad: int | None = None):
    """A tiny HF GPTNeoX (causal LM or one-label classifier) and our model with its weights."""
    import transformers

    from megatron.model.gpt import GPTModel
    from megatron.model.hf_mapping import canonical_from_hf, to_hf_model
    from megatron.model.partition import Sharding
    from megatron.mpu.groups import NO_TP

    torch.manual_seed(seed)
    hf_cfg = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=32, tie_word_embeddings=False)
    lm = transformers.GPTNeoXForCausalLM(hf_cfg).eval()
    canonical, config = canonical_from_hf(dict(lm.state_dict()), hf_cfg)
    if value_head:
        import dataclasses

        config = dataclasses.replace(config, value_head=True)
        L = config.num_layers
        canonical.pop(f"{L + 2}.weight")
        canonical[f"{L + 2}.value.weight"] = torch.randn(1, 32)
        hf = to_hf_model(canonical, config, pad_token_id=pad)
    else:
        hf = lm
    ours = GPTModel(config).eval()
    ours.load_state_dict(Sharding.for_model(config).shard_model(canonical, NO_TP))
    return hf, ours


def _tokenizer(small_data):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=small_data[1], eos_token="<|endoftext|>",
                                   pad_token="<|padding|>")


def _rows(seed: int, n: int, length: int = 12):
    """n sequences: a prompt (no loss), a completion, then padding (id 1, no loss)."""
    rng = np.random.RandomState(seed)
    text = np.ones((n, length), dtype=np.int64)
    label = np.full((n, length), M, dtype=np.int64)
    segment = np.full((n, length), -1, dtype=np.int64)
    for i in range(n):
        prompt, completion = rng.randint(2, 5), rng.randint(2, 6)
        ids = rng.randint(5, 90, prompt + completion)
        text[i, :len(ids)] = ids
        label[i, prompt:len(ids)] = ids[prompt:]
        segment[i, :len(ids)] = 0
    return {k: torch.from_numpy(v) for k, v in
            (("text", text), ("label", label), ("segment", segment))}


def _trl_inputs(rows: dict) -> dict:
    return {"input_ids": rows["text"], "attention_mask": (rows["segment"] >= 0).long(),
            "completion_mask": (rows["label"] >= 0).long()}


class _Logits(torch.nn.Module):
    """An HF causal LM called as our model is (tokens, position ids, mask): its logits."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, tokens, position_ids, mask):
        return self.hf(input_ids=tokens).logits


def _ours(objective, model, reference, batch):
    """Our objective's loss and metrics on `batch`, the logits coming from `model` (and the
    reference log-probabilities from `reference`)."""
    inputs, targets = objective.prepare(batch, OPTIONS)
    if reference is not None:
        from megatron.training.reference import ReferenceModel

        inputs, targets = ReferenceModel(reference, objective.tp, {}).fill(objective, inputs,
                                                                          targets)
    with torch.no_grad():
        return objective.loss(model(*inputs), targets)


def test_dpo_equals_trls_dpo_trainer(small_data, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    hf_policy, policy = _hf_pair(1, 100)
    hf_reference, reference = _hf_pair(2, 100)
    chosen, rejected = _rows(3, 4), _rows(4, 4)
    batch = {f"{side}{'_' + k if k != 'text' else ''}": v
             for side, rows in (("pos", chosen), ("neg", rejected)) for k, v in rows.items()}
    own, _ = _ours(DPO(beta=0.3), policy, reference, batch)  # our models
    hf_own, _ = _ours(DPO(beta=0.3), _Logits(hf_policy), _Logits(hf_reference), batch)
    assert math.isclose(own.item(), hf_own.item(), rel_tol=1e-4)  # the same weights
    trainer = DPOTrainer(model=hf_policy, ref_model=hf_reference,
                         args=DPOConfig(output_dir=str(tmp_path), beta=0.3, report_to=[],
                                        use_cpu=True, precompute_ref_log_probs=False),
                         train_dataset=Dataset.from_list([{"prompt": "a", "chosen": "b",
                                                           "rejected": "c"}]),
                         processing_class=_tokenizer(small_data))
    inputs = {k: torch.cat([_trl_inputs(chosen)[k], _trl_inputs(rejected)[k]])
              for k in ("input_ids", "attention_mask", "completion_mask")}
    with torch.no_grad():
        theirs = trainer._compute_loss(trainer.model, inputs, False)
    # ours on the same log-probabilities: the logits of the models as TRL set them up (it
    # changes how they compute attention: ~1e-5 apart from before)
    ours, _ = _ours(DPO(beta=0.3), _Logits(trainer.model), _Logits(trainer.ref_model), batch)
    assert math.isclose(ours.item(), theirs.item(), rel_tol=1e-6), (ours.item(), theirs.item())
    assert ours.item() > 0.01 and abs(ours.item() - math.log(2)) > 1e-3  # not a trivial case


def test_kto_equals_trls_kto_trainer_with_the_batch_as_its_kl_sample(small_data, tmp_path):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    hf_policy, policy = _hf_pair(6, 100)
    hf_reference, reference = _hf_pair(5, 100)  # the policy is the likelier: a reference point > 0
    rows = _rows(7, 6)
    desirable = torch.tensor([True, False, True, True, False, False])
    reward = torch.where(desirable, 1.0, -1.0)[:, None] * (rows["segment"] >= 0).float()
    kto = KTO(beta=0.2, desirable_weight=1.5, undesirable_weight=0.7)
    own, _ = _ours(kto, policy, reference, {**rows, "reward": reward})
    hf_own, _ = _ours(kto, _Logits(hf_policy), _Logits(hf_reference), {**rows, "reward": reward})
    assert math.isclose(own.item(), hf_own.item(), rel_tol=1e-4)  # the same weights
    trainer = KTOTrainer(model=hf_policy, ref_model=hf_reference,
                         args=KTOConfig(output_dir=str(tmp_path), beta=0.2,
                                        desirable_weight=1.5, undesirable_weight=0.7,
                                        report_to=[], use_cpu=True,
                                        per_device_train_batch_size=2,
                                        precompute_ref_log_probs=False),
                         train_dataset=Dataset.from_list([{"prompt": "a", "completion": "b",
                                                           "label": True}] * 2),
                         processing_class=_tokenizer(small_data))
    trl = _trl_inputs(rows)
    inputs = {**trl, "label": desirable, "KL_input_ids": trl["input_ids"],
              "KL_attention_mask": trl["attention_mask"],
              "KL_completion_mask": trl["completion_mask"]}
    with torch.no_grad():
        theirs = trainer._compute_loss(trainer.model, inputs, False)
    ours, metrics = _ours(kto, _Logits(trainer.model), _Logits(trainer.ref_model),
                          {**rows, "reward": reward})
    assert math.isclose(ours.item(), theirs.item(), rel_tol=1e-6), (ours.item(), theirs.item())
    mode = "train" if trainer.model.training else "eval"
    assert metrics["kto_kl"].item() > 0.05
    assert math.isclose(metrics["kto_kl"].item(), trainer._metrics[mode]["kl"][-1], rel_tol=1e-5)


def test_the_reward_model_equals_trls_reward_trainer(small_data, tmp_path):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    pad, eos = 1, 0
    hf_rm, rm = _hf_pair(8, 100, value_head=True, pad=pad)
    sides = {}
    for side, seed in (("pos", 9), ("neg", 10)):
        rows = _rows(seed, 3)
        text, label = rows["text"].clone(), torch.full_like(rows["label"], M)
        for i in range(3):  # --for-rm: the conversation, two EOS, only the second a label
            end = int((rows["segment"][i] >= 0).sum())
            text[i, end:end + 2] = eos
            label[i, end + 1] = eos
            rows["segment"][i, end:end + 2] = 0
        sides[side] = {"text": text, "label": label, "segment": rows["segment"]}
    batch = {f"{side}{'_' + k if k != 'text' else ''}": v
             for side, rows in sides.items() for k, v in rows.items()}
    ours, _ = _ours(RewardModel(), rm, None, batch)
    # HF reads the last token that is not padding: the first EOS, where ours reads
    input_ids = torch.cat([sides["pos"]["text"], sides["neg"]["text"]])
    labels = torch.cat([sides["pos"]["label"], sides["neg"]["label"]])
    input_ids = torch.where(labels >= 0, torch.full_like(input_ids, pad), input_ids)
    trainer = RewardTrainer(model=hf_rm, args=RewardConfig(output_dir=str(tmp_path),
                                                           report_to=[], use_cpu=True),
                            train_dataset=Dataset.from_list([{"chosen": "a", "rejected": "b"}]),
                            processing_class=_tokenizer(small_data))
    with torch.no_grad():
        theirs = trainer.compute_loss(hf_rm, {"input_ids": input_ids,
                                              "attention_mask": (input_ids != pad).long()})
    assert math.isclose(ours.item(), theirs.item(), rel_tol=1e-6), (ours.item(), theirs.item())

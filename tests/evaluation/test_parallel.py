"""The adapter on 2 gloo processes equals one process: tensor parallelism (vocab-parallel
log-probs, generation) and two replicas splitting the requests and gathering the answers."""

import torch
from lm_eval.api.instance import Instance

from megatron.evaluation.adapter import NeoXLM
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.topology import Topology
from megatron.text_generation.inference_model import InferenceModel
from megatron.text_generation.runtime import Replicas
from tests.distributed import run_distributed
from tests.text_generation.models import IdTokenizer, random_weights, small_config

ATOL = 1e-4


def requests():
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return " ".join(str(i) for i in torch.randint(1, 128, (n,), generator=g).tolist())

    ll = [Instance("loglikelihood", {}, (ids(n), " " + ids(k)), i)
          for i, (n, k) in enumerate([(5, 3), (40, 2), (1, 1), (12, 60), (30, 8)])]
    rolling = [Instance("loglikelihood_rolling", {}, (ids(n),), i)
               for i, n in enumerate([10, 130, 47])]  # 130 > the 48-token context
    gen = [Instance("generate_until", {}, (ids(n), {"until": [" 7"], "max_gen_toks": 9}), i)
           for i, n in enumerate([4, 20, 9])]
    return ll, rolling, gen


def answers(model, replicas=None):
    lm = NeoXLM(model, IdTokenizer(), replicas, batch_size=2)
    ll, rolling, gen = requests()
    return lm.loglikelihood(ll), lm.loglikelihood_rolling(rolling), lm.generate_until(gen)


def _ranks(rank, world):
    import torch.distributed as dist

    config = small_config(vocab=128, rotary_pct=0.25)
    weights = random_weights(config)
    tp = TensorParallel(group=dist.group.WORLD, rank=rank, size=world)
    tensor_parallel = answers(InferenceModel.from_canonical(config, weights, tp))
    replicas = Replicas(index=rank, count=world, writer=rank == 0,
                        topology=Topology(tp=1, pp=1, dp=world))
    replicated = answers(InferenceModel.from_canonical(config, weights, NO_TP), replicas)
    return tensor_parallel, replicated


def test_tensor_parallel_and_replicas_give_the_answers_of_one_process():
    config = small_config(vocab=128, rotary_pct=0.25)
    reference = answers(InferenceModel.from_canonical(config, random_weights(config)))
    assert any(reference[2]) and len(reference[1]) == 3
    for tensor_parallel, replicated in run_distributed(_ranks, 2):
        for got in (tensor_parallel, replicated):
            (ll, rolling, gen), (ref_ll, ref_rolling, ref_gen) = got, reference
            assert [g for _, g in ll] == [g for _, g in ref_ll]
            assert all(abs(a[0] - b[0]) < ATOL for a, b in zip(ll, ref_ll))
            assert all(abs(a - b) < ATOL for a, b in zip(rolling, ref_rolling))
            assert gen == ref_gen

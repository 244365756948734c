"""`NeoXLM`: our model as an lm-evaluation-harness language model (the one adapter class).

    lm = NeoXLM(inference_model, tokenizer, replicas, batch_size=8)
    lm_eval.simple_evaluate(model=lm, tasks=["lambada_openai"], task_manager=...)

Every rank runs the harness on every request (lm-eval sees one process: rank 0 of world 1);
inside each request type the replicas split the requests (sorted by length, dealt out in turn),
tensor-parallel ranks of a replica score the same ones together, and the results are gathered
so every rank hands the harness the same answers. Contexts are tokenized separately from
continuations (trailing whitespace of a context moves to its continuation); an empty context is
replaced by EOD. Sequences longer than the model's context (max_position_embeddings) are scored
in windows (A26, see windows.py); generate_until keeps the last max_length - max_gen_toks
context tokens.
"""

from __future__ import annotations

import json

from megatron.evaluation.lm_eval_version import require_lm_eval

require_lm_eval()  # A28: before anything of lm_eval's is imported

from lm_eval.api.model import LM  # noqa: E402

from megatron.evaluation.scoring import score_windows  # noqa: E402
from megatron.evaluation.windows import scoring_windows  # noqa: E402
from megatron.monitoring.logger import get_logger  # noqa: E402
from megatron.text_generation.generation import (generate, sample_text,  # noqa: E402
                                                 stop_string_checker)
from megatron.text_generation.runtime import Replicas  # noqa: E402
from megatron.text_generation.sampling import SamplingParams, seeded_generators  # noqa: E402

log = get_logger(__name__)

_GEN_KEYS = {"until", "max_gen_toks", "max_new_tokens", "do_sample", "temperature", "top_k",
             "top_p"}


class NeoXLM(LM):
    """lm-eval's LM interface over an InferenceModel on this rank."""

    def __init__(self, model, tokenizer, replicas: Replicas | None = None, batch_size: int = 8,
                 max_gen_toks: int = 128, seed: int = 1234, cache=None):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.replicas = replicas or Replicas()
        self.cache = cache  # a ScoreCache (megatron/evaluation/cache.py) or None
        self.batch_size, self.max_gen_toks, self.seed = batch_size, max_gen_toks, seed
        self.max_length = model.max_positions
        self.eod = tokenizer.eod

    # ---- request types -----------------------------------------------------------------

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """(log p(continuation | context), continuation is the greedy continuation)."""
        items = []
        for req in requests:
            context, continuation = req.args[0], req.args[1]
            ctx, cont = self._encode_pair(context, continuation)
            items.append((ctx + cont, len(cont)))
        results = self._cached_score("loglikelihood", [req.args for req in requests], items)
        for req, value in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, value)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        """log p(text) with EOD as the first context, in windows of the model's context."""
        texts = [self.tokenizer.tokenize(req.args[0]) for req in requests]
        scored = self._cached_score("loglikelihood_rolling", [req.args for req in requests],
                                    [([self.eod] + t, len(t)) for t in texts])
        results = [logprob for logprob, _ in scored]
        for req, value in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, value)
        return results

    def generate_until(self, requests) -> list[str]:
        """Continuations until a stop string, EOD or max_gen_toks; requests with the same
        generation settings are batched together."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        contexts = [req.args[0] for req in requests]

        def run(indices: list[int]) -> list[str]:  # requests of one group
            return self._generate([contexts[i] for i in indices], requests[indices[0]].args[1],
                                  indices)

        keys = [self._generation_key(req.args, i) for i, req in enumerate(requests)]
        out = self._cached("generate_until", keys, [len(c) for c in contexts], run,
                           list(groups.values()))
        for req, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    # ---- helpers -----------------------------------------------------------------------

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx = self.tokenizer.tokenize(context) if context else []
        return ctx or [self.eod], self.tokenizer.tokenize(continuation)

    def _cached_score(self, kind: str, args_list: list, items: list) -> list:
        """`_score(items)`, through the cache when there is one."""
        return self._cached(kind, args_list, [len(tokens) for tokens, _ in items],
                            lambda chunk: self._score([items[i] for i in chunk]))

    def _cached(self, kind: str, args_list: list, lengths: list[int], run,
                groups: list[list[int]] | None = None) -> list:
        """`run(indices)` over each group of request indices (all of them by default), or with
        a cache: the stored results, and the rest run in rounds of the cache's round size
        (longest first), each round stored before the next; a request that occurs more than
        once is run once."""
        groups = groups if groups is not None else [list(range(len(args_list)))]
        out: list = [None] * len(args_list)
        if self.cache is None:
            for group in groups:
                for i, value in zip(group, run(group)):
                    out[i] = value
            return out
        from megatron.evaluation.cache import request_key

        first: dict[str, int] = {}  # a request asked again (lm-eval repeats some) counts once
        keys = [request_key(kind, args) for args in args_list]
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        unique = sorted(first.values())
        found = dict(zip(unique, self.cache.lookup(kind, [args_list[i] for i in unique])))
        size = self.cache.round_size
        for group in groups:
            todo = sorted((i for i in group if first[keys[i]] == i and found[i] is None),
                          key=lambda i: -lengths[i])
            for start in range(0, len(todo), size):
                chunk = todo[start:start + size]
                values = run(chunk)
                self.cache.store(kind, [args_list[i] for i in chunk], values)
                found.update(zip(chunk, values))
        return [found[first[key]] for key in keys]

    def _generation_key(self, args: tuple, index: int) -> tuple:
        """What a generation depends on beyond the model: the context, the settings, the
        default length and, when sampling, the seed and the request's place (its generator is
        seeded by both)."""
        context, gen_kwargs = args[0], args[1]
        sampled = bool((gen_kwargs or {}).get("do_sample"))
        return (context, gen_kwargs, self.max_gen_toks,
                (self.seed, index) if sampled else None)

    def _score(self, items: list[tuple[list[int], int]]) -> list[tuple[float, bool]]:
        """(sum of log-probs, all greedy) per (tokens, number of trailing tokens scored)."""
        order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))
        mine = [order[p] for p in self.replicas.split(len(order))]
        windows = []
        for position, i in enumerate(mine):
            tokens, scored = items[i]
            windows += scoring_windows(tokens, scored, self.max_length, request=position)
        scored_windows = score_windows(self.model, windows, self.batch_size, self.tokenizer.pad)
        local = [[0.0, True] for _ in mine]
        for w, (logprob, greedy) in zip(windows, scored_windows):
            local[w.request][0] += logprob
            local[w.request][1] = local[w.request][1] and greedy
        gathered = self.replicas.gather([tuple(v) for v in local], len(order))
        results: list = [None] * len(items)
        for position, i in enumerate(order):
            results[i] = gathered[position]
        return results

    def _generate(self, contexts: list[str], gen_kwargs: dict, indices: list[int]) -> list[str]:
        kwargs = dict(gen_kwargs or {})
        ignored = sorted(set(kwargs) - _GEN_KEYS)
        if ignored:
            log.warning("generate_until ignores generation settings %s", ", ".join(ignored))
        until = kwargs.get("until") or []
        until = tuple([until] if isinstance(until, str) else until)
        max_new = int(kwargs.get("max_gen_toks", kwargs.get("max_new_tokens", self.max_gen_toks)))
        if max_new >= self.max_length:
            raise ValueError(f"max_gen_toks({max_new}) must be below the model's context "
                             f"({self.max_length} tokens)")
        params = SamplingParams()  # greedy, as lm-eval's Hugging Face model without do_sample
        if kwargs.get("do_sample"):
            params = SamplingParams(float(kwargs.get("temperature", 0.0)),
                                    int(kwargs.get("top_k") or 0), float(kwargs.get("top_p") or 0.0))
        keep = self.max_length - max_new
        prompts = [(self.tokenizer.tokenize(c) or [self.eod])[-keep:] for c in contexts]
        mine = self.replicas.split(len(prompts))
        generators = None if params.greedy else seeded_generators(
            self.seed, [indices[i] for i in mine], self.model.device)
        results = generate(self.model, [prompts[i] for i in mine], max_new, params,
                           frozenset({self.eod}), self.batch_size, generators,
                           text_stop=stop_string_checker(until, self.tokenizer.detokenize),
                           pad_id=self.tokenizer.pad)
        texts = [sample_text(self.tokenizer.detokenize, g, until) for g in results]
        return self.replicas.gather(texts, len(prompts))

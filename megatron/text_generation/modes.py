"""generate.py's work: prompts by mode (unconditional, input-file, interactive) -> JSON lines.

Every rank runs `run_generation(args)`. The prompts go longest first, in rounds of one batch
per replica (`generation_batch_size` prompts each); after each round the ranks agree whether a
stop signal came, and a stop writes the samples done so far (Preempted, status 128 + signal).
Global rank 0 gathers and writes `sample_output_file`, in index order, one JSON object per line:

    {"index": 0, "context": "...", "text": "...", "prompt_token_ids": [...], "token_ids": [...],
     "length": 12, "finished": true, "stop_reason": "stop_token", "message": null,
     "duration_seconds": 0.41, "batch_size": 8}

`text` is the generated text without the stop token and cut before any stop string, and
without the first bytes of a character that maximum_tokens cut in two (generation.sample_text);
`token_ids` are the generated ids (ending with the stop id when one ended the sample);
`length` counts them without that stop id, as GPT-NeoX does; `message` is null, or says that
the first token generated was the stop token (text "", length 0);
`finished` is false when maximum_tokens ran out; `duration_seconds` is the wall time of the
batch the sample was generated in. Unconditional samples start from EOD (as does an empty
prompt). Sampling is reproducible: sample i draws from its own generator seeded from (seed, i).
In interactive mode rank 0 reads prompts from stdin until EOF (one per line, or up to each
prompt_end), prints each sample and appends it to the output file.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from megatron.monitoring.logger import get_logger, print_rank_0
from megatron.monitoring.progress import progress
from megatron.safety.signals import Preempted, StopSignals
from megatron.text_generation.checks import validate_stop_ids, validate_stop_strings
from megatron.text_generation.generation import generate, sample_text, stop_string_checker
from megatron.text_generation.prompts import check_lengths, prompt_tokens, read_prompts
from megatron.text_generation.runtime import InferenceRuntime, inference_runtime
from megatron.text_generation.sampling import SamplingParams, seeded_generators

log = get_logger(__name__)


class _Sampler:
    """Turns prompt texts into records with the run's settings on one runtime."""

    def __init__(self, rt: InferenceRuntime):
        tg, tok = rt.args.text_generation, rt.tokenizer
        self.rt, self.tg, self.tok = rt, tg, tok
        self.params = SamplingParams(tg.temperature, tg.top_k, tg.top_p)
        self.stop_ids = validate_stop_ids(tg.stop_token_ids, tok.vocab_size, tok.eod)  # A13
        self.stop_strings = validate_stop_strings(tg.stop_strings)
        self.text_stop = stop_string_checker(self.stop_strings, tok.detokenize)

    def encode(self, text: str) -> list[int]:
        return prompt_tokens(self.tok, text)

    def check_lengths(self, lengths: list[int], first_index: int = 0) -> None:
        check_lengths(lengths, self.tg.maximum_tokens,  # A14
                      self.rt.args.model.max_position_embeddings, first_index)

    def records(self, texts: list[str], indices: list[int]) -> list[dict]:
        """Records for every prompt (gathered on every rank), texts[j] numbered indices[j]."""
        rt = self.rt
        prompts = [self.encode(t) for t in texts]
        mine = rt.replicas.split(len(prompts))
        generators = None
        if not self.params.greedy:
            generators = seeded_generators(rt.args.training.seed, [indices[i] for i in mine],
                                           rt.model.device)
        results = generate(rt.model, [prompts[i] for i in mine], self.tg.maximum_tokens,
                           self.params, self.stop_ids, self.tg.generation_batch_size, generators,
                           use_cache=not self.tg.recompute, text_stop=self.text_stop,
                           pad_id=self.tok.pad)
        local = [self._record(indices[i], texts[i], g) for i, g in zip(mine, results)]
        return rt.replicas.gather(local, len(prompts))

    def _record(self, index: int, context: str, g) -> dict:
        text = sample_text(self.tok.detokenize, g, self.stop_strings)
        length = len(g.ids) - (g.stop_reason == "stop_token")  # GPT-NeoX's: the stop left out
        message = None if length or g.stop_reason != "stop_token" else (
            "text generation did not start: the first token generated was a stop token")
        return {"index": index, "context": context, "text": text,
                "prompt_token_ids": g.prompt_ids, "token_ids": g.ids, "length": length,
                "finished": g.stop_reason != "length", "stop_reason": g.stop_reason,
                "message": message, "duration_seconds": round(g.seconds, 6),
                "batch_size": g.batch_size}


def _broadcast(value):
    """Rank 0's value on every rank."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _from_rank_0(writer: bool, read):
    """read() on rank 0 only; its value, or the user error it raised, on every rank."""
    outcome = None
    if writer:
        try:
            outcome = ("value", read())
        except (ValueError, FileNotFoundError) as err:
            outcome = ("error", err)
    kind, value = _broadcast(outcome)
    if kind == "error":
        raise value
    return value


def run_generation(args, stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[dict]:
    """Generate per `args.derived.text_gen_type`; returns the records (complete on rank 0)."""
    with inference_runtime(args) as rt:
        sampler = _Sampler(rt)
        mode = args.derived.text_gen_type
        if mode == "interactive":
            rt.load_model()
            return _interactive(sampler, stdin or sys.stdin, stdout or sys.stdout)
        if mode == "unconditional":
            texts = [""] * args.text_generation.num_samples
        else:
            tg = args.text_generation
            texts = _from_rank_0(rt.replicas.writer,
                                 lambda: read_prompts(tg.sample_input_file, tg.prompt_end))
        lengths = [len(sampler.encode(t)) for t in texts]
        sampler.check_lengths(lengths)  # before the weights load
        rt.load_model()
        began = time.perf_counter()
        records, signum = _in_rounds(sampler, texts, lengths)
        out = args.derived.sample_output_path
        if rt.replicas.writer:
            _write(records, out, "w")
            tokens = sum(r["length"] for r in records)
            seconds = time.perf_counter() - began
            print_rank_0(f"generated {len(records)} sample(s), {tokens} tokens in {seconds:.2f} s "
                         f"({tokens / max(seconds, 1e-9):.1f} tokens/s); wrote {out}")
        if signum:
            raise Preempted(signum, f"stopped ({signal.Signals(signum).name}) after "
                                    f"{len(records)} of {len(texts)} sample(s): {out} holds "
                                    "those, each with its prompt's index")
        return records


def _in_rounds(sampler: _Sampler, texts: list[str], lengths: list[int]) -> tuple[list, int]:
    """(records in index order, 0) for every prompt, or (those done, the signal) after a stop
    signal. Prompts go longest first in rounds of one batch per replica; the ranks agree after
    each round whether a signal asks them to stop."""
    rt = sampler.rt
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    size = rt.replicas.count * sampler.tg.generation_batch_size
    rounds = [order[s:s + size] for s in range(0, len(order), size)]
    done: list[dict] = []
    signum = 0
    with StopSignals("stopping after this batch; the samples done so far are written") as stops:
        for rows in progress(rounds, desc="generating", unit="batch") if len(rounds) > 1 \
                else rounds:
            done += sampler.records([texts[i] for i in rows], rows)
            signum = stops.agreed()
            if signum:
                break
    if len(done) == len(texts):
        signum = 0  # the signal came with the last round: nothing is missing
    return sorted(done, key=lambda r: r["index"]), signum


def read_interactive_prompt(stdin: TextIO, prompt_end: str) -> str | None:
    """The next prompt typed (None at EOF): one line, or with a `prompt_end` other than a
    newline the lines up to the first `prompt_end`, joined by newlines, as GPT-NeoX reads them
    (text after it on that line is dropped)."""
    lines = []
    while True:
        line = stdin.readline()
        if not line:
            return "\n".join(lines) if lines else None
        line = line.rstrip("\n")
        if prompt_end == "\n":
            return line
        if prompt_end in line:
            return "\n".join([*lines, line.split(prompt_end)[0]])
        lines.append(line)


def _interactive(sampler: _Sampler, stdin: TextIO, stdout: TextIO) -> list[dict]:
    """Prompts from stdin (read on rank 0: read_interactive_prompt) until EOF; each sample
    printed and appended."""
    rt = sampler.rt
    out_file = rt.args.derived.sample_output_path
    records, index = [], 0
    if rt.replicas.writer:
        Path(out_file).parent.mkdir(parents=True, exist_ok=True)
        Path(out_file).write_text("", encoding="utf-8")
        print_rank_0(f"samples are appended to {out_file}")
    while True:
        line = None
        if rt.replicas.writer:
            stdout.write("prompt> ")
            stdout.flush()
            line = read_interactive_prompt(stdin, rt.args.text_generation.prompt_end)
        line = _broadcast(line)
        if line is None:
            if rt.replicas.writer:
                stdout.write("\n")  # after the last prompt>, so what follows starts a line
                stdout.flush()
            return records
        try:
            sampler.check_lengths([len(sampler.encode(line))], index)
        except ValueError as err:  # a too-long prompt ends that prompt, not the session
            if rt.replicas.writer:
                stdout.write(f"error: {err}\n")
            continue
        record = sampler.records([line], [index])[0]
        index += 1
        records.append(record)
        if rt.replicas.writer:
            stdout.write(f"generated> {record['text']}\n")
            stdout.flush()
            _write([record], out_file, "a")


def _write(records: list[dict], path: str, mode: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

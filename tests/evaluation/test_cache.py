"""eval_cache_dir: an evaluation stopped part-way and run again scores only what the first run
did not finish, and ends with the results of a run that was never stopped; another checkpoint,
tokenizer or model config is another cache file."""

import json
import shutil
import sqlite3

import pytest
import torch

from megatron.checkpointing.reader import read_checkpoint
from megatron.checkpointing.weights_only import write_weights_checkpoint
from megatron.evaluation.adapter import NeoXLM
from megatron.evaluation.cache import ScoreCache
from megatron.evaluation.run import score_cache
from megatron.evaluation.tasks import task_manager_for
from megatron.mpu.groups import NO_TP
from megatron.neox_arguments import NeoXArgs
from megatron.text_generation.runtime import InferenceRuntime, Replicas, load_inference_model
from megatron.tokenizer import build_tokenizer
from tests.runs import ROOT, deepy, explain, free_port

TASKS = ROOT / "tests/evaluation/tasks"
GEN_TASKS = ROOT / "tests/evaluation/gen_tasks"
SETUP = {"checkpoint": "test", "iteration": 30, "batch_size": 1}


class Stopped(Exception):
    """The stop injected into the first run (a preemption, a crash)."""


@pytest.fixture(scope="module")
def model_and_tokenizer(trained):
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + ["num_gpus=1"])
    tokenizer = build_tokenizer("HFTokenizer", trained["tokenizer"])
    model, _, _ = load_inference_model(args, tokenizer, NO_TP, torch.device("cpu"))
    return model, tokenizer


def evaluate(lm, monkeypatch):
    from lm_eval.evaluator import simple_evaluate

    monkeypatch.chdir(ROOT)  # the task files name their data relative to the repository root
    return simple_evaluate(model=lm, tasks=["tiny_mc", "tiny_rolling"], num_fewshot=0,
                           bootstrap_iters=0, log_samples=False,
                           task_manager=task_manager_for(["tiny_mc", "tiny_rolling"],
                                                         [str(TASKS)]))["results"]


def cached_lm(model_and_tokenizer, directory, round_batches: int, seed: int = 1234):
    """(NeoXLM at batch size 1 with a cache in `directory`, the cache)."""
    model, tokenizer = model_and_tokenizer
    cache = ScoreCache.open(str(directory), SETUP, Replicas(), round_batches=round_batches)
    return NeoXLM(model, tokenizer, batch_size=1, seed=seed, cache=cache), cache


def counting_forward(model, monkeypatch, stop_after: int | None = None) -> list[int]:
    """Count the model's forward passes (one per batch); raise Stopped at pass stop_after."""
    calls, forward = [0], model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        if stop_after is not None and calls[0] > stop_after:
            raise Stopped
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    return calls


def test_a_stopped_evaluation_resumes_from_its_cache(model_and_tokenizer, tmp_path, monkeypatch):
    model, tokenizer = model_and_tokenizer

    def lm(directory):
        return cached_lm(model_and_tokenizer, directory, round_batches=2)

    with monkeypatch.context() as m:
        calls = counting_forward(model, m)
        plain = evaluate(NeoXLM(model, tokenizer, batch_size=1), m)
        every = calls[0]
    with monkeypatch.context() as m:
        whole, cache = lm(tmp_path / "whole")
        calls = counting_forward(model, m)
        never_stopped = evaluate(whole, m)
        assert calls[0] == every
    (path,) = (tmp_path / "whole").glob("scores-*.sqlite")
    stored = sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert stored == 23  # 5 questions x 4 choices, 3 rolling texts
    # stopped in the fourth round: three rounds of two requests were kept
    with monkeypatch.context() as m:
        first, cache = lm(tmp_path / "stopped")
        counting_forward(model, m, stop_after=7)
        with pytest.raises(Stopped):
            evaluate(first, m)
        cache.close()
    (path,) = (tmp_path / "stopped").glob("scores-*.sqlite")
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 6
    with monkeypatch.context() as m:
        again, cache = lm(tmp_path / "stopped")
        calls = counting_forward(model, m)
        resumed = evaluate(again, m)
        assert calls[0] == every - 6  # one forward pass per request at batch size 1
    for task in ("tiny_mc", "tiny_rolling"):
        numbers = {k: v for k, v in never_stopped[task].items() if isinstance(v, float)}
        assert numbers and {k: resumed[task][k] for k in numbers} == numbers
        for key, value in numbers.items():
            assert plain[task][key] == pytest.approx(value, rel=1e-5), (task, key)
    # another setup (here the batch size) is another file: nothing of this one is read
    other = ScoreCache.open(str(tmp_path / "stopped"), {**SETUP, "batch_size": 2}, Replicas())
    assert other.path != cache.path and other.lookup("loglikelihood", [("a", "b")]) == [None]


def test_a_request_asked_twice_is_scored_once(model_and_tokenizer, tmp_path, monkeypatch):
    """lm-eval repeats requests (the same continuation after an empty context, for one); with
    a cache each is scored once, so the rounds of a resumed run are those of the first."""
    from types import SimpleNamespace

    model, tokenizer = model_and_tokenizer
    cache = ScoreCache.open(str(tmp_path), SETUP, Replicas(), round_batches=1)
    lm = NeoXLM(model, tokenizer, batch_size=1, cache=cache)
    asked = [("The history of", " the city"), ("", " is long."), ("The history of", " the city"),
             ("", " is long."), ("In the year", " 1900")]
    calls = counting_forward(model, monkeypatch)
    scores = lm.loglikelihood([SimpleNamespace(args=a) for a in asked])
    assert calls[0] == 3 and scores[0] == scores[2] and scores[1] == scores[3]
    plain = NeoXLM(model, tokenizer, batch_size=1).loglikelihood(
        [SimpleNamespace(args=a) for a in asked])
    assert scores == plain


def generated(lm, monkeypatch) -> list[str]:
    """tiny_gen through lm-eval: each prompt's continuation as the harness received it."""
    from lm_eval.evaluator import simple_evaluate

    monkeypatch.chdir(ROOT)
    out = simple_evaluate(model=lm, tasks=["tiny_gen"], num_fewshot=0, bootstrap_iters=0,
                          log_samples=True, task_manager=task_manager_for(["tiny_gen"],
                                                                          [str(GEN_TASKS)]))
    samples = sorted(out["samples"]["tiny_gen"], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples]


def test_a_stopped_generation_task_resumes_from_its_cache(model_and_tokenizer, tmp_path,
                                                          monkeypatch):
    """generate_until requests are kept too: a generation task stopped part-way and run again
    generates only the prompts the first run did not finish, and the harness receives the
    texts of a run without a cache."""
    model, tokenizer = model_and_tokenizer

    def lm():
        return cached_lm(model_and_tokenizer, tmp_path, round_batches=1)

    with monkeypatch.context() as m:
        calls = counting_forward(model, m)
        plain = generated(NeoXLM(model, tokenizer, batch_size=1), m)
        every = calls[0]
    assert len(plain) == 6 and any(plain)
    with monkeypatch.context() as m:
        first, cache = lm()
        counting_forward(model, m, stop_after=every // 2)
        with pytest.raises(Stopped):
            generated(first, m)
        cache.close()
    (path,) = tmp_path.glob("scores-*.sqlite")
    kept = sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert 0 < kept < 6
    with monkeypatch.context() as m:
        again, cache = lm()
        calls = counting_forward(model, m)
        assert generated(again, m) == plain
        assert 0 < calls[0] < every
        cache.close()
    with monkeypatch.context() as m:  # everything kept: no forward pass at all
        third, cache = lm()
        calls = counting_forward(model, m)
        assert generated(third, m) == plain and calls[0] == 0


def test_sampled_generations_are_kept_by_place_and_seed(model_and_tokenizer, tmp_path,
                                                        monkeypatch):
    """A sampled request's generator is seeded by the eval seed and the request's place, so
    two equal sampled requests are two results (a greedy repeat is one), a resumed run gives
    the texts of an uncached one, and another seed is not read from the cache."""
    from types import SimpleNamespace

    model, tokenizer = model_and_tokenizer
    sample = {"until": ["\n"], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
    greedy = {"until": ["\n"], "max_gen_toks": 8}
    asked = [SimpleNamespace(args=a) for a in [
        ("The history of", sample), ("The history of", sample), ("In the year", greedy),
        ("In the year", greedy), ("The river", sample)]]
    plain = NeoXLM(model, tokenizer, batch_size=1, seed=7).generate_until(asked)
    assert plain[2] == plain[3] and plain[0] != plain[1]  # equal requests, sampled apart

    def lm(seed=7):
        return cached_lm(model_and_tokenizer, tmp_path, round_batches=1, seed=seed)[0]

    with monkeypatch.context() as m:
        counting_forward(model, m, stop_after=8)
        with pytest.raises(Stopped):
            lm().generate_until(asked)
    (path,) = tmp_path.glob("scores-*.sqlite")
    kept = sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert 0 < kept < 4  # four distinct requests: the greedy repeat is one
    with monkeypatch.context() as m:
        calls = counting_forward(model, m)
        assert lm().generate_until(asked) == plain and calls[0] > 0
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 4
    with monkeypatch.context() as m:
        calls = counting_forward(model, m)
        other = lm(seed=8).generate_until(asked)
    assert other == NeoXLM(model, tokenizer, batch_size=1, seed=8).generate_until(asked)
    assert calls[0] > 0  # the three sampled requests again; the greedy one was kept
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 7


def cache_file(args) -> str:
    """The file eval.py's key (run.score_cache) names for `args`, with the checkpoint loaded
    as eval.py loads it."""
    tok = args.tokenizer
    tokenizer = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
    rt = InferenceRuntime(args, tokenizer, Replicas(), NO_TP, torch.device("cpu"))
    rt.load_model()
    cache = score_cache(args, rt)
    cache.close()
    return cache.path.name


def test_a_moved_or_changed_checkpoint_tokenizer_or_model_config_starts_another_file(
        trained, tmp_path):
    """The key of eval.py's cache: the same command twice opens the same file; the checkpoint
    re-saved at the same path and iteration with one weight changed, the tokenizer file
    rewritten in place, a model config value changed, or the checkpoint moved each open
    another file, so no run reads the scores of another model."""
    ckpt, vocab, cache = tmp_path / "ckpt", tmp_path / "tokenizer.json", tmp_path / "cache"
    shutil.copytree(trained["ckpt"], ckpt)
    shutil.copy(trained["tokenizer"], vocab)

    def args_for(*overrides: str, load=ckpt) -> NeoXArgs:
        return NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
            "num_gpus=1", f"load={load}", f"vocab_file={vocab}", f"eval_cache_dir={cache}",
            *overrides])

    def name(*overrides: str, load=ckpt) -> str:
        args = args_for(*overrides, load=load)
        first = cache_file(args)
        assert cache_file(args) == first  # nothing changed: the same file
        return first

    base = name()
    # a model config value: the window lm-eval's requests are scored in (an architecture
    # value, rotary_pct say, is refused by the load: the checkpoint was trained with another)
    assert name("seq_length=32") != base
    # the tokenizer file, same path, two ids swapped: the same text becomes other tokens
    original = vocab.read_bytes()
    tokenizer = json.loads(original)
    ids = tokenizer["model"]["vocab"]
    ids["a"], ids["b"] = ids["b"], ids["a"]
    vocab.write_text(json.dumps(tokenizer))
    assert name() != base
    vocab.write_bytes(original)
    assert name() == base  # the tokenizer back as it was: the first file again
    # the checkpoint moved
    ckpt.rename(tmp_path / "moved")
    assert name(load=tmp_path / "moved") != base
    (tmp_path / "moved").rename(ckpt)
    # re-trained: other weights written at the same path and iteration (its manifest differs)
    args = args_for()
    weights = read_checkpoint(ckpt, run_args=args).canonical
    step = ckpt / "global_step30"

    def resave(canonical):
        shutil.rmtree(step)
        write_weights_checkpoint(ckpt, 30, canonical, args, tp=1)

    resave(weights)
    saved = name()
    resave({**weights, "1.attention.dense.weight": weights["1.attention.dense.weight"] + 1e-3})
    assert name() != saved
    resave(weights)
    assert name() == saved  # the same weights again: the same manifest, the same file
    # base, seq_length, tokenizer, moved, re-saved, re-saved with a weight changed
    assert len(list(cache.glob("scores-*.sqlite"))) == 6


def test_a_launch_run_again_with_its_cache_scores_nothing_twice(trained, tmp_path):
    """Two replicas: the writer reads the cache and hands every rank what it found."""
    results = []
    for run in ("first", "again"):
        prefix = tmp_path / run / "tiny"
        proc = deepy("eval.py", str(ROOT / "configs/tiny.yml"), *trained["overrides"],
                     "num_gpus=2", f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}, {TASKS}]",
                     "eval_bootstrap_iters=0", f"eval_results_prefix={prefix}",
                     f"eval_cache_dir={tmp_path / 'cache'}", f"log_dir={tmp_path / 'logs'}",
                     f"master_port={free_port()}", "distributed_timeout_minutes=1",
                     "eval_batch_size=2")
        assert proc.returncode == 0, explain(proc)
        (path,) = (tmp_path / run).glob("tiny_eval_results_*.json")
        results.append(json.loads(path.read_text())["results"])
        found = "20 of 20" if run == "again" else "0 of 20"
        assert f"eval cache: {found} loglikelihood requests already scored" in proc.stderr, \
            proc.stderr[-3000:]
    assert results[0] == results[1]
    assert len(list((tmp_path / "cache").glob("scores-*.sqlite"))) == 1


@pytest.mark.slow  # three launches, one stopped by a real signal (about 40 s)
def test_sigterm_part_way_keeps_the_finished_rounds_for_the_next_run(trained, tmp_path):
    """A real SIGTERM to deepy.py while eval.py scores 1,600 requests (one at a time, rounds of
    32): the run ends with 143, what it finished stays, and the same command run again scores
    only the rest and writes the results of a run that was never stopped."""
    import random
    import signal
    import subprocess
    import sys
    import time

    rng = random.Random(0)
    words = [json.loads(line) for line in open(TASKS / "tiny_mc.jsonl")]
    with open(tmp_path / "many_mc.jsonl", "w") as f:
        for i in range(400):
            doc = words[i % len(words)]
            f.write(json.dumps({**doc, "question": f"{doc['question']} ({i})",
                                "answer": rng.randrange(4)}) + "\n")
    task = (TASKS / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: many_mc")
    task = task.replace("tests/evaluation/tasks/tiny_mc.jsonl", str(tmp_path / "many_mc.jsonl"))
    (tmp_path / "many_mc.yaml").write_text(task)

    def command(run: str) -> list[str]:
        return [sys.executable, str(ROOT / "deepy.py"), "eval.py", str(ROOT / "configs/tiny.yml"),
                *trained["overrides"], "num_gpus=1", f"eval_tasks=[{tmp_path / 'many_mc.yaml'}]",
                "eval_bootstrap_iters=0", f"eval_results_prefix={tmp_path / run / 'r'}",
                f"eval_cache_dir={tmp_path / run / 'cache'}", f"log_dir={tmp_path / 'logs'}",
                f"master_port={free_port()}", "eval_batch_size=1"]

    def rows(run: str) -> int:
        found = list((tmp_path / run / "cache").glob("scores-*.sqlite"))
        if not found:
            return 0
        with sqlite3.connect(found[0]) as db:
            try:
                return db.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
            except sqlite3.OperationalError:  # the table is being created
                return 0

    proc = subprocess.Popen(command("stopped"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while rows("stopped") < 64 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    assert "passing it to the workers, which stop at once; what they scored stays in " \
           "eval_cache_dir" in out
    kept = rows("stopped")
    assert 64 <= kept < 1600 and kept % 32 == 0, kept
    assert not list((tmp_path / "stopped").glob("r_eval_results_*.json"))
    again = subprocess.run(command("stopped"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, explain(again)
    assert f"eval cache: {kept} of 1600 loglikelihood requests already scored" in again.stderr
    whole = subprocess.run(command("whole"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert whole.returncode == 0, explain(whole)
    results = [json.loads(next((tmp_path / run).glob("r_eval_results_*.json")).read_text())
               for run in ("stopped", "whole")]
    assert results[0]["results"] == results[1]["results"] and rows("stopped") == 1600

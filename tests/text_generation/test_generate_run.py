"""generate.py on a trained checkpoint: the three modes in process (one rank), the errors a user
sees, and real launches (2 replicas; model_parallel_size 2; pipe_parallel_size 2 folded into
replicas) that must give the samples of one process."""

import io
import json
import logging
import re
import socket
import time

import pytest

from megatron.neox_arguments import NeoXArgs
from megatron.text_generation.modes import run_generation
from tests.runs import ROOT, deepy, explain, free_port

CONFIGS = [str(ROOT / "configs/tiny.yml"), str(ROOT / "configs/text_generation.yml")]


def make_args(trained, tmp_path, **overrides):
    values = {"num_gpus": 1, "distributed_timeout_minutes": 1,
              "sample_output_file": str(tmp_path / "out.jsonl"), "maximum_tokens": 12,
              "temperature": 0.0, **overrides}
    overrides = trained["overrides"] + [f"{k}={v}" for k, v in values.items()]
    return NeoXArgs.from_ymls(CONFIGS, overrides)


def read_jsonl(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_input_file_mode_writes_one_record_per_prompt(trained, tmp_path, one_rank):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The history of\n\nIn the year\nA\n")  # the blank prompt is skipped
    args = make_args(trained, tmp_path, text_gen_type="input-file",
                     sample_input_file=str(prompts), generation_batch_size=2)
    records = run_generation(args)
    assert read_jsonl(tmp_path / "out.jsonl") == records
    assert [r["context"] for r in records] == ["The history of", "In the year", "A"]
    from megatron.tokenizer import build_tokenizer

    tok = build_tokenizer("HFTokenizer", trained["tokenizer"])
    for r in records:
        assert r["prompt_token_ids"] == tok.tokenize(r["context"])
        body = r["token_ids"][:-1] if r["stop_reason"] == "stop_token" else r["token_ids"]
        assert r["text"] == tok.detokenize(body) and r["length"] == len(body) <= 12
        assert r["message"] is None if body or r["stop_reason"] != "stop_token" else (
            r["message"].startswith("text generation did not start"))
        assert r["finished"] == (r["stop_reason"] != "length") and r["duration_seconds"] > 0
    recomputed = run_generation(args.replace(recompute=True, generation_batch_size=3))
    assert [r["token_ids"] for r in recomputed] == [r["token_ids"] for r in records]


def test_unconditional_samples_are_reproducible_from_the_seed(trained, tmp_path, one_rank):
    args = make_args(trained, tmp_path, text_gen_type="unconditional", num_samples=3,
                     temperature=1.0, top_p=0.9)
    first = [r["token_ids"] for r in run_generation(args)]
    assert [r["token_ids"] for r in run_generation(args)] == first
    assert [r["token_ids"] for r in run_generation(args.replace(seed=99))] != first
    assert all(r["context"] == "" and r["prompt_token_ids"] == [0]
               for r in read_jsonl(tmp_path / "out.jsonl"))


def test_interactive_mode_reads_prompts_until_eof_and_survives_a_too_long_one(
        trained, tmp_path, one_rank):
    args = make_args(trained, tmp_path, text_gen_type="interactive")
    stdin = io.StringIO("The history of\n" + "word " * 200 + "\nA\n")  # >= 200 tokens
    stdout = io.StringIO()
    records = run_generation(args, stdin=stdin, stdout=stdout)
    assert [r["context"] for r in records] == ["The history of", "A"]
    shown = stdout.getvalue()
    assert "must not exceed max_position_embeddings(128)" in shown
    assert f"prompt> generated> {records[0]['text']}\n" in shown and shown.endswith("prompt> \n")
    assert read_jsonl(tmp_path / "out.jsonl") == records


def test_interactive_prompts_end_at_prompt_end_as_in_gpt_neox():
    from megatron.text_generation.modes import read_interactive_prompt

    typed = io.StringIO("first line\nsecond ### ignored\nlast\n")
    assert read_interactive_prompt(typed, "###") == "first line\nsecond "
    assert read_interactive_prompt(typed, "###") == "last"  # ended by EOF
    assert read_interactive_prompt(typed, "###") is None
    typed = io.StringIO("one\ntwo\n")
    assert [read_interactive_prompt(typed, "\n") for _ in range(3)] == ["one", "two", None]


@pytest.mark.parametrize("override, message", [
    ({"load": "{tmp}/no_checkpoints"}, r"checkpoint directory .*no_checkpoints \(config key "
                                       r"'load'\) does not exist"),
    ({"stop_token_ids": "[5000]"}, r"stop_token_ids entry 5000 is not a token id of the "
                                   r"tokenizer \(ids are 0..2047\)"),
    ({"text_gen_type": "input-file", "sample_input_file": "{tmp}/absent.txt"},
     r"sample_input_file .*absent.txt does not exist"),
    ({"text_gen_type": "input-file", "sample_input_file": "{tmp}/long.txt",
      "maximum_tokens": "100"}, r"prompt 0 has \d+ tokens: prompt tokens \+ maximum_tokens\(100\) "
                              r"must not exceed max_position_embeddings\(128\)"),
])
def test_bad_input_ends_generate_py_with_one_line(trained, tmp_path, one_rank, capsys,
                                                  monkeypatch, override, message):
    import generate

    # entry scripts install a log handler on the stderr of their time: give this call its own
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])

    (tmp_path / "long.txt").write_text("the history of the river " * 10 + "\n")  # >= 50 tokens
    values = {k: v.replace("{tmp}", str(tmp_path)) for k, v in override.items()}
    args = make_args(trained, tmp_path, **values)
    assert generate.main(["--neox_args", args.encode()]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith(f"error (rank 0 on {socket.gethostname()}): ")
    assert re.search(message, errors[0]), errors[0]


@pytest.mark.parametrize("layout, said", [
    ("model_parallel_size=2", ["for model_parallel_size 2"]),
    ("pipe_parallel_size=2", ["pipe_parallel_size 2 is folded into replicas for inference: "
                              "every tensor-parallel group holds all layers",
                              "inference on 2 rank(s): model_parallel_size 1, 2 replica(s)"]),
], ids=["tensor", "pipeline"])
def test_a_parallel_launch_gives_the_samples_of_one_process(trained, tmp_path, one_rank,
                                                            layout, said):
    """2 processes started by the launcher on the checkpoint saved by one: resharded for 2
    tensor-parallel ranks, or with 2 pipeline stages folded into 2 replicas that split the
    prompts (and so batch and pad them differently). Sampled with temperature, so every logit
    matters."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The history of\nIn the year\nA\nShe said\n")
    settings = dict(text_gen_type="input-file", sample_input_file=str(prompts),
                    maximum_tokens=16, temperature=0.8, top_k=40, generation_batch_size=3)
    one = run_generation(make_args(trained, tmp_path, **settings))
    out = tmp_path / "parallel.jsonl"
    proc = deepy("generate.py", *CONFIGS, *trained["overrides"], "num_gpus=2", layout,
                 f"sample_output_file={out}", *[f"{k}={v}" for k, v in settings.items()],
                 f"master_port={free_port()}", "distributed_timeout_minutes=1")
    assert proc.returncode == 0, explain(proc)
    assert all(line in proc.stderr for line in said), explain(proc)
    assert [r["token_ids"] for r in read_jsonl(out)] == [r["token_ids"] for r in one]
    assert len(one) == 4 and any(r["length"] > 1 for r in one)


def test_samples_go_under_log_dir_when_no_output_file_is_given(trained, tmp_path, one_rank,
                                                               monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    before = set(ROOT.iterdir())
    overrides = trained["overrides"] + ["num_gpus=1", "maximum_tokens=4", "num_samples=2",
                                        "text_gen_type=unconditional", f"log_dir={tmp_path}"]
    records = run_generation(NeoXArgs.from_ymls(CONFIGS, overrides))
    out = tmp_path / "samples" / "samples.jsonl"
    assert read_jsonl(out) == records and len(records) == 2
    assert f"; wrote {out}\n" in capsys.readouterr().out
    assert set(ROOT.iterdir()) == before


def test_sigterm_to_deepy_keeps_the_samples_generated_so_far(trained, tmp_path, one_rank):
    """A preempted generate.py (2 replicas) finishes its batch, writes every sample done, in
    index order and equal to the same samples of an uninterrupted run, and exits 143."""
    import signal
    import subprocess
    import sys

    from tests.runs import wait_for_text

    out, log_path = tmp_path / "samples.jsonl", tmp_path / "deepy.log"
    settings = dict(text_gen_type="unconditional", maximum_tokens=6, temperature=1.0,
                    generation_batch_size=2)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "generate.py", *CONFIGS,
             *trained["overrides"], "num_gpus=2", "num_samples=100000",
             f"sample_output_file={out}", *[f"{k}={v}" for k, v in settings.items()],
             f"master_port={free_port()}", "distributed_timeout_minutes=1"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_text(log_path, "] loaded ", proc)
            time.sleep(3)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 143, log_path.read_text()[-3000:]
        finally:
            proc.kill()
    said = log_path.read_text()
    assert "deepy.py: received SIGTERM: passing it to the workers, which stop after the current " \
           "batch and write the samples done so far;" in said, said[-3000:]
    written = read_jsonl(out)
    done = len(written)
    assert 0 < done < 100000
    assert re.search(rf"\nstopped \(SIGTERM\) after {done} of 100000 sample\(s\): {out} holds "
                     r"those, each with its prompt's index\n", said), said[-3000:]
    assert "Traceback" not in said
    # equal prompts go in index order: the first `done` samples, as a run of just those gives
    assert [r["index"] for r in written] == list(range(done))
    first = run_generation(make_args(trained, tmp_path, num_samples=min(done, 8),
                                     sample_output_file=str(tmp_path / "first.jsonl"),
                                     **settings))
    assert [r["token_ids"] for r in written[:len(first)]] == [r["token_ids"] for r in first]


def test_a_tokenizer_other_than_the_checkpoints_is_refused_before_any_worker(trained, tmp_path):
    """The checkpoint's config.yml names its tokenizer type: generating from it with another
    (whose ids are other text to the model) is refused by deepy.py in one line."""
    from megatron.preflight import preflight

    args = make_args(trained, tmp_path, tokenizer_type="CharLevelTokenizer")
    step_dir = trained["ckpt"] / "global_step30"
    with pytest.raises(ValueError) as err:
        preflight(args, "generate.py")
    assert str(err.value) == (
        f"checkpoint {step_dir} was trained with tokenizer_type HFTokenizer (its config.yml), "
        "but this run's is CharLevelTokenizer: the model reads ids of its own tokenizer as "
        f"other text. Use its tokenizer (tokenizer_type HFTokenizer, vocab_file as in "
        f"{step_dir / 'config.yml'})")
    preflight(make_args(trained, tmp_path), "generate.py")

"""lm-eval through our adapter on a trained checkpoint: the harness's numbers equal what the
model's log-likelihoods give directly (multiple choice, rolling perplexity, generation), and a
real launch with two replicas writes the same results."""

import json
import math

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from megatron.evaluation.adapter import NeoXLM
from megatron.evaluation.tasks import task_manager_for
from megatron.mpu.groups import NO_TP
from megatron.neox_arguments import NeoXArgs
from megatron.text_generation.runtime import load_inference_model
from megatron.tokenizer import build_tokenizer
from tests.runs import ROOT, deepy, explain, free_port

TASKS = ROOT / "tests/evaluation/tasks"
ATOL = 1e-4  # fp32 log-likelihood sums of < 200 tokens, batched vs one at a time


@pytest.fixture(scope="module")
def lm(trained):
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + ["num_gpus=1"])
    tokenizer = build_tokenizer("HFTokenizer", trained["tokenizer"])
    model, _, _ = load_inference_model(args, tokenizer, NO_TP, torch.device("cpu"))
    return NeoXLM(model, tokenizer, batch_size=3)


@pytest.fixture(scope="module")
def harness(lm, trained):
    from lm_eval.evaluator import simple_evaluate

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the task files name their data relative to the repository root
        return simple_evaluate(
            model=lm, tasks=["tiny_mc", "tiny_rolling"], num_fewshot=0, bootstrap_iters=0,
            task_manager=task_manager_for(["tiny_mc", "tiny_rolling"], [str(TASKS)]),
            log_samples=False)["results"]


def direct_loglikelihood(lm, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One forward pass over context + continuation, log_softmax over the full vocabulary."""
    tokens = torch.tensor([context + continuation])
    with torch.inference_mode():
        logits = lm.model.forward(tokens[:, :-1], torch.arange(tokens.shape[1] - 1)[None])
    logp = torch.log_softmax(logits.float(), dim=-1)[0, -len(continuation):]
    targets = tokens[0, -len(continuation):]
    picked = logp.gather(-1, targets[:, None]).squeeze(-1)
    return float(picked.sum()), bool((logp.argmax(-1) == targets).all())


def docs(name):
    return [json.loads(line) for line in open(TASKS / f"{name}.jsonl")]


def test_multiple_choice_accuracy_equals_the_direct_computation(lm, harness):
    tok = lm.tokenizer
    acc, acc_norm = [], []
    for doc in docs("tiny_mc"):
        lls = [direct_loglikelihood(lm, tok.tokenize(doc["question"]),
                                    tok.tokenize(" " + choice))[0] for choice in doc["choices"]]
        ours = lm.loglikelihood([Instance("loglikelihood", doc, (doc["question"], " " + c), i)
                                 for i, c in enumerate(doc["choices"])])
        assert [o[0] for o in ours] == pytest.approx(lls, abs=ATOL)
        acc.append(int(max(range(4), key=lambda i: lls[i]) == doc["answer"]))
        norm = [ll / len(c) for ll, c in zip(lls, doc["choices"])]
        acc_norm.append(int(max(range(4), key=lambda i: norm[i]) == doc["answer"]))
    assert harness["tiny_mc"]["acc,none"] == pytest.approx(sum(acc) / len(acc))
    assert harness["tiny_mc"]["acc_norm,none"] == pytest.approx(sum(acc_norm) / len(acc_norm))


def test_rolling_loglikelihood_of_a_long_text_equals_the_sum_over_windows(lm, harness):
    tok = lm.tokenizer
    texts = [d["text"] for d in docs("tiny_rolling")]
    tokens = tok.tokenize(texts[0])
    assert len(tokens) > 2 * lm.max_length  # several windows
    direct = []
    for text in texts:
        total = 0.0
        for window in get_rolling_token_windows(tok.tokenize(text), tok.eod, lm.max_length, 1):
            ctx, cont = make_disjoint_window(window)
            total += direct_loglikelihood(lm, ctx, cont)[0]
        direct.append(total)
    ours = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i)
                                     for i, t in enumerate(texts)])
    assert ours == pytest.approx(direct, abs=ATOL)
    bits = -sum(direct) / sum(len(t.encode()) for t in texts) / math.log(2)
    assert harness["tiny_rolling"]["bits_per_byte,none"] == pytest.approx(bits, rel=1e-5)


def test_generate_until_equals_a_plain_greedy_loop_cut_at_the_stop_string(lm):
    tok = lm.tokenizer
    context = "The history of the"
    tokens = tok.tokenize(context)
    with torch.inference_mode():
        for _ in range(24):
            logits = lm.model.forward(torch.tensor([tokens]), torch.arange(len(tokens))[None])
            tokens.append(int(logits[0, -1, :tok.vocab_size].argmax()))
            if tokens[-1] == tok.eod:
                break
    generated = tokens[len(tok.tokenize(context)):]
    text = tok.detokenize(generated[:-1] if generated[-1] == tok.eod else generated)
    stop = text.strip()[-2:] if len(text.strip()) > 4 else "\n"
    (out,) = lm.generate_until([Instance("generate_until", {},
                                         (context, {"until": [stop], "max_gen_toks": 24}), 0)])
    expected = text[:text.index(stop)] if stop in text else text
    assert out == expected


def test_a_launch_with_two_replicas_writes_the_harness_results(trained, harness, tmp_path):
    prefix = tmp_path / "results" / "tiny"
    # a task file giving no aggregation: lm-eval warns about it on each rank
    bare = (TASKS / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: bare_mc")
    bare = "\n".join(line for line in bare.splitlines()
                     if "aggregation" not in line and "higher_is_better" not in line)
    (tmp_path / "bare_mc.yaml").write_text(bare + "\n")
    proc = deepy("eval.py", str(ROOT / "configs/tiny.yml"), *trained["overrides"], "num_gpus=2",
                 f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}, {TASKS}, {tmp_path / 'bare_mc.yaml'}]",
                 "eval_bootstrap_iters=0",
                 f"eval_results_prefix={prefix}", f"log_dir={tmp_path / 'logs'}",
                 f"master_port={free_port()}", "distributed_timeout_minutes=1", "eval_batch_size=2")
    assert proc.returncode == 0, explain(proc)
    (path,) = (tmp_path / "results").glob("tiny_eval_results_*.json")
    written = json.loads(path.read_text())
    assert written["checkpoint"]["replicas"] == 2 and written["checkpoint"]["iteration"] == 30
    for task in ("tiny_mc", "tiny_rolling"):
        for key, value in harness[task].items():
            if isinstance(value, float):
                assert written["results"][task][key] == pytest.approx(value, rel=1e-5), key
    logged = [json.loads(line) for line in open(tmp_path / "logs" / "metrics.jsonl")]
    assert logged[-1]["iteration"] == 30
    assert logged[-1]["eval/tiny_mc/acc"] == pytest.approx(harness["tiny_mc"]["acc,none"])
    # the console: lm-eval's warnings about bare_mc.yaml once for both ranks in the project's
    # form, none about the shipped task files (they give each metric's aggregation); no
    # progress bars (not a terminal), no warning that the default of 0 few-shot examples is
    # applied
    harness_lines = [line for line in proc.stderr.splitlines() if "[lm_eval]" in line]
    assert any("[WARNING] [lm_eval] [Task: bare_mc] metric acc is defined, but aggregation is "
               "not" in line for line in harness_lines), proc.stderr[-3000:]
    assert all(line.startswith("[ranks 0-1] ") for line in harness_lines), harness_lines
    assert not [line for line in harness_lines if "tiny_" in line], harness_lines
    assert "it/s]" not in proc.stderr and "Overwriting default num_fewshot" not in proc.stderr


def test_a_bf16_config_runs_the_model_in_bf16_and_scores_in_fp32(trained, lm):
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"],
                              trained["overrides"] + ["num_gpus=1", "precision=bf16"])
    model, _, _ = load_inference_model(args, lm.tokenizer, NO_TP, torch.device("cpu"))
    assert model.dtype == torch.bfloat16
    requests = [Instance("loglikelihood", {}, ("The history of the", " river"), 0),
                Instance("loglikelihood", {}, ("In the year", " 1900, the town grew"), 1)]
    half = NeoXLM(model, lm.tokenizer).loglikelihood(requests)
    full = lm.loglikelihood(requests)
    assert [h[0] for h in half] == pytest.approx([f[0] for f in full], rel=0.05, abs=0.1)


def test_results_go_under_log_dir_when_no_prefix_is_given(trained, tmp_path, monkeypatch):
    from megatron.evaluation.run import run_evaluation

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    before = set(ROOT.iterdir())
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}]", "eval_bootstrap_iters=0",
        f"log_dir={tmp_path / 'logs'}", "distributed_timeout_minutes=1", "eval_limit=2",
        "eval_num_fewshot=1"])
    results = run_evaluation(args)
    assert results["results"]["tiny_mc"]
    # eval_limit and eval_num_fewshot reach lm-eval: 2 of the 5 questions, with one example
    assert results["n-samples"]["tiny_mc"] == {"original": 5, "effective": 2}
    assert results["n-shot"]["tiny_mc"] == 1
    (path,) = (tmp_path / "logs" / "eval").glob("eval_results_*.json")
    assert json.loads(path.read_text())["checkpoint"]["iteration"] == 30
    assert set(ROOT.iterdir()) == before


def test_an_eval_limit_below_1_scores_that_fraction_rounded_up(trained, tmp_path, monkeypatch):
    """eval_limit 0.5 is half of each task's documents, rounded up as lm-eval rounds it
    (evaluator_utils.get_sample_size: ceil): tiny_mc's first 3 of 5 questions and
    tiny_rolling's first 2 of 3 texts are all the model scores, and the results file says
    so (n-samples, and the limit as given)."""
    from megatron.evaluation.run import run_evaluation

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    asked: dict[str, list] = {}
    for kind in ("loglikelihood", "loglikelihood_rolling"):
        def recorded(self, requests, _kind=kind, _score=getattr(NeoXLM, kind)):
            asked.setdefault(_kind, []).extend(r.args for r in requests)
            return _score(self, requests)

        monkeypatch.setattr(NeoXLM, kind, recorded)
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", f"eval_tasks=[{TASKS}]", "eval_bootstrap_iters=0", "eval_limit=0.5",
        f"eval_results_prefix={tmp_path / 'r'}", f"log_dir={tmp_path / 'logs'}",
        "distributed_timeout_minutes=1"])
    run_evaluation(args)
    questions = {(d["question"], " " + c) for d in docs("tiny_mc")[:3] for c in d["choices"]}
    assert len(asked["loglikelihood"]) == 12 and set(asked["loglikelihood"]) == questions
    assert asked["loglikelihood_rolling"] == [(d["text"],) for d in docs("tiny_rolling")[:2]]
    (path,) = tmp_path.glob("r_eval_results_*.json")
    written = json.loads(path.read_text())
    assert written["n-samples"] == {"tiny_mc": {"original": 5, "effective": 3},
                                    "tiny_rolling": {"original": 3, "effective": 2}}
    assert written["config"]["limit"] == 0.5


def test_a_task_template_naming_a_field_the_documents_lack_ends_in_one_line(trained, tmp_path,
                                                                           monkeypatch):
    """A local task whose doc_to_text names a field its documents do not have: one error
    naming the field and the keys to check, not jinja's traceback from every rank."""
    from megatron.evaluation.run import run_evaluation

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    task = tmp_path / "typo_mc.yaml"
    task.write_text((TASKS / "tiny_mc.yaml").read_text().replace(
        "task: tiny_mc", "task: typo_mc").replace("{{question}}", "{{questoin}}"))
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", f"eval_tasks=[{task}]", "eval_bootstrap_iters=0",
        f"eval_results_prefix={tmp_path / 'r'}", f"log_dir={tmp_path / 'logs'}",
        "distributed_timeout_minutes=1"])
    with pytest.raises(ValueError) as err:
        run_evaluation(args)
    assert str(err.value) == (
        "a task's template could not be filled from its documents ('questoin' is undefined); "
        "check doc_to_text, doc_to_target and doc_to_choice of the tasks typo_mc against the "
        "fields of their data")

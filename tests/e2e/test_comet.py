"""GPT-NeoX's own configs/local_setup_comet.yml on a real run (`python deepy.py train.py
configs/tiny.yml local_setup_comet.yml ...`, one process): with no Comet API key on the worker
the experiment is logged offline under log_dir, and its archive holds what GPT-NeoX's setup asks
for and the metrics the other trackers get, under GPT-NeoX's tags (train/lm_loss, validation/...)."""

import math

from megatron.monitoring.trackers import tracker_tag
from tests.monitoring.comet_archive import read_comet_archive
from tests.runs import ROOT, SHORT_RUN, deepy, explain, read_metrics, tiny_overrides

NEOX_COMET = ROOT / "tests/neox_arguments/data/gpt-neox/local_setup_comet.yml"


def test_neox_comet_setup_logs_an_offline_experiment(small_data, tmp_path, monkeypatch):
    for name in ("COMET_API_KEY", "COMET_START_ONLINE", "COMET_OFFLINE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    prefix, tok = small_data
    run = tmp_path / "run"
    # the file's paths are GPT-NeoX's; the run's data, outputs and tokenizer are the test's
    over = tiny_overrides(prefix, tok, run, num_gpus=1, merge_file="null",
                          tensorboard_dir=str(run / "tb"), **SHORT_RUN)
    proc = deepy("train.py", "configs/tiny.yml", str(NEOX_COMET), *over)
    assert proc.returncode == 0, explain(proc)
    comet_dir = run / "logs" / "comet"
    warning = (f"use_comet is on but no Comet API key reached this worker (COMET_API_KEY unset, "
               f"none in ~/.comet.config): logging offline to {comet_dir}")
    assert warning in proc.stderr + proc.stdout

    archive = read_comet_archive(comet_dir)
    assert archive.experiment["project_name"] == "test_project"
    assert archive.experiment["workspace"] is None  # commented out in the file
    assert sorted(archive.experiment["tags"]) == ["test_tag1", "test_tag2"]
    assert archive.others["Name"] == "test_experiment"
    assert "test_others" in archive.others  # `{"test_others"}`: a key without a value
    assert archive.parameters["comet_project"] == "test_project"
    assert archive.parameters["train_iters"] == 4
    assert archive.parameters["comet_tags"] == ["test_tag1", "test_tag2"]
    assert "neox_args" not in archive.parameters  # the worker's command line is not parsed

    train, val = read_metrics(run / "logs")
    for record in train + val:
        step = record["iteration"]
        for name, value in record.items():
            if name in ("iteration", "time"):
                continue
            tag, expected = tracker_tag(name, value)
            assert math.isclose(archive.metrics[tag][step], expected, rel_tol=1e-6), (name, step)
    assert {"train/lm_loss", "train/learning_rate", "train/grad_norm", "validation/lm_loss",
            "validation/lm_loss_ppl", "test/lm_loss"} <= set(archive.metrics)
    assert sorted(archive.metrics["train/lm_loss"]) == [2, 4]

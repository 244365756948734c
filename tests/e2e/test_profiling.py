"""GPT-NeoX's configs/prof.yml on a real run through `python deepy.py train.py`: the profiled
steps leave a torch.profiler trace (Chrome JSON, beside TensorBoard's event file) and a memory
timeline, and the run says where they went."""

import json

from tests.runs import ROOT, deepy, explain, tiny_overrides

PROF_YML = ROOT / "tests/neox_arguments/data/gpt-neox/prof.yml"
PHASES = {"Get batch", "Forward pass", "Backward pass", "Optimizer step"}


def test_prof_yml_traces_the_profiled_steps(small_data, tmp_path):
    prefix, tok = small_data
    tb, memory = tmp_path / "tb", tmp_path / "memory"
    # prof.yml's window (10 to 12) and directories, moved to a 3-step run in tmp_path
    over = tiny_overrides(prefix, tok, tmp_path, num_gpus=1, train_iters=3, log_interval=1,
                          eval_interval=10, save="null", load="null",
                          profile_step_start=1, profile_step_stop=3, tensorboard_dir=str(tb),
                          memory_profiling_path=str(memory))
    proc = deepy("train.py", "configs/tiny.yml", str(PROF_YML), *over)
    assert proc.returncode == 0, explain(proc)

    [trace] = tb.glob("rank0.*.pt.trace.json")
    assert f"profiler trace of iterations 2 to 3: {trace} " in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert PHASES <= names, f"phase labels missing: {PHASES - names}"
    assert sorted(n for n in names if n and n.startswith("ProfilerStep#")) == [
        "ProfilerStep#2", "ProfilerStep#3"]
    assert list(tb.glob("events.out.tfevents.*")), "the metrics' TensorBoard file is missing"

    timeline = memory / "memory_timeline_rank0.json"
    assert f"memory profile of iterations 2 to 3: {timeline} " in proc.stdout
    steps = json.loads(timeline.read_text())["steps"]
    assert [s["iteration"] for s in steps] == [2, 3]
    assert all(s["rss_bytes"] > 0 for s in steps)

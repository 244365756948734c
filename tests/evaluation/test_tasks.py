"""Task names, local task files and directories; unknown tasks; the lm-eval version (A28)."""

from pathlib import Path

import pytest

from megatron.evaluation.lm_eval_version import check_lm_eval_version, require_lm_eval
from megatron.evaluation.tasks import (check_eval_settings, check_task_names,
                                       resolve_task_entries, task_name_of,
                                       task_manager_for, unknown_tasks_message)
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT

TASKS = ROOT / "tests/evaluation/tasks"


def test_task_entries_may_be_names_yaml_files_or_directories(tmp_path):
    names, include = resolve_task_entries(
        ["lambada_openai", str(TASKS / "tiny_mc.yaml")], None)
    assert names == ["lambada_openai", "tiny_mc"] and include == [str(TASKS)]
    names, include = resolve_task_entries([str(TASKS)], [str(tmp_path)])
    assert names == ["tiny_mc", "tiny_rolling"] and include == [str(tmp_path), str(TASKS)]
    with pytest.raises(FileNotFoundError, match=r"task file .*missing.yaml \(in eval_tasks\) "
                       "does not exist"):
        resolve_task_entries([str(tmp_path / "missing.yaml")], None)
    (tmp_path / "t.yml").write_text("task: x\n")
    with pytest.raises(ValueError, match=r"lm-eval only reads task files named \*.yaml"):
        resolve_task_entries([str(tmp_path / "t.yml")], None)
    with pytest.raises(FileNotFoundError, match="eval_include_path entry .*nope is not a dir"):
        resolve_task_entries(["x"], [str(tmp_path / "nope")])
    (tmp_path / "local.yaml").write_text("task: local\ndataset_path: json\n")
    with pytest.raises(ValueError, match=r"task file .*local.yaml: dataset_path json reads local "
                       r"files but names none; add dataset_kwargs: \{data_files: "):
        resolve_task_entries([str(tmp_path / "local.yaml")], None)
    (tmp_path / "local.yaml").write_text("task: local\ndataset_path: json\ninclude: base.yaml\n")
    assert resolve_task_entries([str(tmp_path / "local.yaml")], None)[0] == ["local"]


def test_local_tasks_load_without_scanning_the_registry():
    manager = task_manager_for(["tiny_mc", "tiny_rolling"], [str(TASKS)])
    assert set(manager.all_tasks) == {"tiny_mc", "tiny_rolling"}


def test_an_unknown_task_is_named_with_the_nearest_known_names():
    message = unknown_tasks_message(["hellaswg", "zzz"], ["hellaswag", "lambada_openai"])
    assert message.startswith("unknown lm-eval task 'hellaswg' (did you mean: hellaswag?), "
                              "'zzz'; a task is a name from lm-eval's registry, a path to a "
                              "task .yaml file")


def test_eval_without_lm_eval_is_refused_with_the_install_command(monkeypatch):
    """lm-eval missing (the one failure faked: its distribution is not found)."""
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(RuntimeError, match=r"^eval.py needs lm-eval, which is not installed: "
                       r"pip install -r requirements/requirements-eval.txt"):
        require_lm_eval()


def test_lm_eval_outside_the_supported_range_is_refused_with_the_install_command():
    assert require_lm_eval().startswith("0.4.")
    check_lm_eval_version("0.4.2")
    check_lm_eval_version("0.4.13.dev0")
    for bad in ("0.3.0", "0.4.1", "0.5.0", "1.0"):
        with pytest.raises(RuntimeError, match=rf"lm-eval {bad} is installed, but the eval adapter "
                           r"is written for lm-eval>=0.4.2,<0.5 .* run: pip install -r "
                           r"requirements/requirements-eval.txt"):
            check_lm_eval_version(bad)


def test_eval_py_names_an_unknown_task_in_one_line(monkeypatch, capsys):
    """The registry is replaced by a small fake so that the test needs no 10 s scan."""
    import logging

    import lm_eval.tasks

    import eval as eval_script
    from megatron.neox_arguments import NeoXArgs

    class Registry:
        def __init__(self, include_path=None, include_defaults=True):
            self.all_tasks = ["hellaswag", "lambada_openai"] if include_defaults else []

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Registry)
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], ["eval_tasks=[hellaswg]"])
    assert eval_script.main(["--neox_args", args.encode()]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert errors == ["error: unknown lm-eval task 'hellaswg' (did you mean: hellaswag?); a task "
                      "is a name from lm-eval's registry, a path to a task .yaml file, a "
                      "directory of them, or a name defined in eval_include_path"]


def test_deepy_refuses_a_task_name_no_task_file_spells_before_any_worker(monkeypatch, tmp_path):
    """deepy.py's check reads the text of lm-eval's own task files (and the include path's):
    names they spell pass without building the registry; a name none spells is looked up in
    the registry, here a small fake that says which names it was asked about."""
    import lm_eval.tasks

    from megatron.neox_arguments import NeoXArgs
    from megatron.preflight import preflight

    built = []

    class Registry:
        def __init__(self, include_path=None, include_defaults=True):
            built.append(include_defaults)
            self.all_tasks = (["hellaswag", "lambada_openai"] if include_defaults else []) + [
                task_name_of(f) for d in include_path or () for f in Path(d).glob("*.yaml")]

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Registry)
    # registry names spelt in lm-eval's files (a group, and a tag set in an included
    # template without .yaml), and a name a local directory defines
    (tmp_path / "mine.yaml").write_text("task: my_local_task\ndataset_path: json\n")
    check_task_names(["lambada_openai", "mmlu", "acp_bench", "my_local_task"], [str(tmp_path)])
    assert built == []
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"],
                              ["eval_tasks=[hellaswg]", f"load={tmp_path / 'none'}"])
    with pytest.raises(ValueError, match=r"^unknown lm-eval task 'hellaswg' \(did you mean: "
                       r"hellaswag\?\); a task is a name from lm-eval's registry"):
        preflight(args, "eval.py")
    assert built == [True]
    built.clear()
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"],
                              [f"eval_tasks=[{TASKS / 'tiny_mc.yaml'}, tiny_rolling, zzz_task]"])
    with pytest.raises(ValueError, match=r"^unknown lm-eval task 'zzz_task'; a task is"):
        preflight(args, "train.py")  # during training too; the local names are known
    assert built == [False, True]  # the local directory first, then with the registry


def test_lmeval_log_level_shows_the_harness_info_lines(monkeypatch):
    """docs/evaluate.md: lm-eval's info lines are hidden unless LMEVAL_LOG_LEVEL asks for them;
    a value that is not a level keeps them hidden."""
    import logging

    from megatron.evaluation.tasks import quiet_harness

    harness = logging.getLogger("lm_eval")
    before = harness.level
    try:
        for value, level in (("INFO", logging.INFO), ("debug", logging.DEBUG),
                             ("LOUD", logging.WARNING), (None, logging.WARNING)):
            if value is None:
                monkeypatch.delenv("LMEVAL_LOG_LEVEL", raising=False)
            else:
                monkeypatch.setenv("LMEVAL_LOG_LEVEL", value)
            quiet_harness()
            assert harness.level == level, value
    finally:
        harness.setLevel(before)


@pytest.mark.parametrize("limit, error", [
    (0, "eval_limit(0) must be positive (or null for all)"),
    (2.5, "eval_limit(2.5) is a count of documents per task from 1 up, so it must be whole "
          "(e.g. 2), or a fraction of them below 1"),
])
def test_an_eval_limit_lm_eval_would_not_take_as_given_is_refused(limit, error):
    """lm-eval takes int(limit) documents from 1 up, so 2.5 would quietly be 2."""
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"],
                              ["eval_tasks=[tiny_mc]", f"eval_limit={limit}"])
    with pytest.raises(ValueError) as err:
        check_eval_settings(args.eval)
    assert str(err.value) == error
    for fine in (0.5, 1, 3, 3.0):
        check_eval_settings(args.replace(eval_limit=fine).eval)


def test_a_local_tasks_missing_data_file_is_named_with_its_task(tmp_path, monkeypatch):
    from megatron.evaluation.tasks import check_local_data_files

    monkeypatch.chdir(ROOT)  # the shipped tasks' data_files are relative to the repository
    check_local_data_files([str(TASKS / "tiny_mc.yaml"), str(TASKS)])
    task = tmp_path / "my_mc.yaml"
    task.write_text((TASKS / "tiny_mc.yaml").read_text().replace(
        "task: tiny_mc", "task: my_mc").replace("tiny_mc.jsonl", "my_mc_missing.jsonl"))
    with pytest.raises(FileNotFoundError) as err:
        check_local_data_files([str(task)])
    assert str(err.value) == (
        f"task my_mc ({task}): dataset_kwargs.data_files.test "
        "tests/evaluation/tasks/my_mc_missing.jsonl does not exist (a relative path is read "
        f"from the working directory, {ROOT})")

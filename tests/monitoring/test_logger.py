"""What the logger does with DeepSpeed's own prints."""

import logging


def test_deepspeed_prints_become_debug_lines(capsys, caplog):
    from megatron.monitoring.logger import deepspeed_prints

    with caplog.at_level(logging.DEBUG, logger="megatron"):
        with deepspeed_prints():
            print("steps: 10 loss: 7.9269 iter time (s): 0.065")
            print("")
    assert capsys.readouterr().out == ""
    debug = [r for r in caplog.records if r.name == "megatron.deepspeed"]
    assert [(r.levelno, r.getMessage()) for r in debug] == [
        (logging.DEBUG, "steps: 10 loss: 7.9269 iter time (s): 0.065")]


def test_deepspeed_logger_lines_take_the_projects_form_on_stderr(monkeypatch, capsys):
    """DeepSpeed's own warnings (e.g. its bf16 accumulation notice) print as '[rank N] [time]
    [WARNING] [deepspeed] ...' on stderr, like every other line, so the launcher merges them
    across ranks; DeepSpeed's handler writes to stdout, which the launcher does not merge."""
    import sys

    from megatron.monitoring.logger import setup_logging

    ds = logging.getLogger("DeepSpeed")
    handler = logging.StreamHandler(sys.stdout)  # what deepspeed.utils.logging installs
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s] %(message)s"))
    monkeypatch.setattr(ds, "handlers", [handler])
    root = logging.getLogger("megatron")  # restored after: other tests rely on propagation
    saved = (list(root.handlers), root.propagate, root.level)
    monkeypatch.setenv("RANK", "3")
    try:
        setup_logging()
        setup_logging()  # again: still one handler
        ds.warning("**** BF16 gradient accumulation is not safe ****")
    finally:
        root.handlers[:], root.propagate = saved[0], saved[1]
        root.setLevel(saved[2])
    out, err = capsys.readouterr()
    assert out == "" and len(ds.handlers) == 1
    line = err.strip()
    assert line.startswith("[rank 3] [") and \
        line.endswith("] [WARNING] [deepspeed] **** BF16 gradient accumulation is not safe ****")


def test_log_lines_go_to_the_stderr_of_the_moment_not_the_one_at_setup(monkeypatch):
    """Set up while stderr was one stream (a test's capture, a redirect), the handler must not
    keep writing there once it is closed: each line goes to sys.stderr as it is then."""
    import contextlib
    import io

    from megatron.monitoring.logger import get_logger, setup_logging

    root = logging.getLogger("megatron")  # restored after: other tests rely on propagation
    saved = (list(root.handlers), root.propagate, root.level)
    monkeypatch.delenv("RANK", raising=False)
    first, second = io.StringIO(), io.StringIO()
    try:
        root.handlers[:] = []
        with contextlib.redirect_stderr(first):
            setup_logging()
            get_logger("tests.a").info("one")
        first.close()
        with contextlib.redirect_stderr(second):
            get_logger("tests.a").info("two")
            setup_logging()  # a second setup keeps the one handler
            get_logger("tests.a").warning("three")
    finally:
        root.handlers[:], root.propagate = saved[0], saved[1]
        root.setLevel(saved[2])
    lines = second.getvalue().splitlines()
    assert [line.split("] ", 3)[-1] for line in lines] == ["two", "three"], lines
    assert "[INFO] [megatron.tests.a]" in lines[0]


def test_deepspeed_warnings_that_do_not_apply_are_hidden_inside_the_block_only(monkeypatch):
    import io

    from megatron.monitoring.logger import deepspeed_warnings_hidden
    from megatron.training.engine import NO_ACCUMULATION_WARNINGS

    stream = io.StringIO()
    ds = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(ds, "handlers", [logging.StreamHandler(stream)])
    notice = ("**** BF16 gradient accumulation is not safe numerically with large number of "
              "accumulation steps, proceed with caution *****")  # DeepSpeed 0.19's words
    with deepspeed_warnings_hidden(NO_ACCUMULATION_WARNINGS):
        ds.warning(notice)
        ds.warning("another warning")
    ds.warning(notice)
    assert stream.getvalue().splitlines() == ["another warning", notice]
    # the pattern still matches the installed DeepSpeed's own text
    import inspect
    import re

    import deepspeed.runtime.engine

    assert re.search(NO_ACCUMULATION_WARNINGS[0], inspect.getsource(deepspeed.runtime.engine))

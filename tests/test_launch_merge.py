"""Warnings several ranks print alike become one line naming the ranks; the rest of the workers'
output (progress bars redrawn with carriage returns included) passes through unchanged."""

import io
import os
import time

from megatron.launching.merge import WarningMerger, parse_ranks, pipe_lines, split_line


def test_a_line_splits_into_its_ranks_time_stamp_and_text():
    assert split_line("node-a: [ranks 0-3, 8] [12:00:01] [WARNING] [x] hi") == \
        ({0, 1, 2, 3, 8}, "[12:00:01] ", "[WARNING] [x] hi")
    assert split_line("[rank 2] [12:00:01] [INFO] [x] hi") == ({2}, "[12:00:01] ", "[INFO] [x] hi")
    assert split_line("[2026-11-25 21:40:19,833] [WARNING] [ds.py:1:f] hi") == \
        (None, "[2026-11-25 21:40:19,833] ", "[WARNING] [ds.py:1:f] hi")
    assert split_line(" iteration 10/20 | lm_loss 2.1") == (None, "", " iteration 10/20 | lm_loss 2.1")
    assert parse_ranks("0, 2-4") == {0, 2, 3, 4}


def test_warnings_alike_are_printed_once_with_their_ranks_and_other_lines_at_once():
    out = io.StringIO()
    merger = WarningMerger(out, range(4), window=0.3)
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] same")
    merger.feed(1, "[rank 1] [12:00:02] [WARNING] [a] same")  # another second: still alike
    merger.feed(2, "[rank 2] [12:00:02] [INFO] [a] nothing held for rank 2")
    assert out.getvalue().splitlines() == ["[rank 2] [12:00:02] [INFO] [a] nothing held for rank 2"]
    merger.feed(0, "[rank 0] [12:00:02] [INFO] [a] after the warning")  # waits behind it
    merger.feed(None, "node-b: [ranks 2-3] [12:00:01] [WARNING] [a] same")  # all 4: out at once
    assert out.getvalue().splitlines()[1:] == ["[ranks 0-3] [12:00:01] [WARNING] [a] same",
                                               "[rank 0] [12:00:02] [INFO] [a] after the warning"]
    merger.feed(3, "[rank 3] [12:00:05] [WARNING] [a] only here")
    merger.feed(1, "[rank 1] [12:00:05] [WARNING] [a] two of four")
    merger.feed(2, "[rank 2] [12:00:06] [WARNING] [a] two of four")
    time.sleep(0.6)  # past the window: printed with the ranks seen so far
    merger.close()
    assert out.getvalue().splitlines()[3:] == ["[rank 3] [12:00:05] [WARNING] [a] only here",
                                               "[ranks 1-2] [12:00:05] [WARNING] [a] two of four"]


def test_a_ranks_lines_keep_their_order_around_a_warning_only_it_prints():
    """A warning one rank prints alone is held for the window like any other; the lines that rank
    prints after it wait behind it (a reshard's warning before its 'saved checkpoint' line), and
    so do a warning merged with other ranks and those ranks' lines after it. A rank with nothing
    held prints at once."""
    out = io.StringIO()
    merger = WarningMerger(out, range(2), window=0.3)
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] resharded into this layout")
    merger.feed(0, "[rank 0] [12:00:01] [INFO] [a] saved checkpoint")
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] second warning")
    merger.feed(0, "[rank 0] [12:00:02] [INFO] [a] done")
    merger.feed(1, "[rank 1] [12:00:02] [WARNING] [a] second warning")  # both ranks: printed
    merger.feed(1, "[rank 1] [12:00:02] [INFO] [a] rank 1 goes on")
    assert out.getvalue() == ""
    time.sleep(0.6)  # the first warning's window passed: it and what waited behind it, in order
    assert out.getvalue().splitlines() == [
        "[rank 0] [12:00:01] [WARNING] [a] resharded into this layout",
        "[rank 0] [12:00:01] [INFO] [a] saved checkpoint",
        "[ranks 0-1] [12:00:01] [WARNING] [a] second warning",
        "[rank 0] [12:00:02] [INFO] [a] done",
        "[rank 1] [12:00:02] [INFO] [a] rank 1 goes on"]
    merger.feed(1, "[rank 1] [12:00:03] [INFO] [a] nothing held for rank 1")
    merger.feed(0, "[rank 0] [12:00:03] [WARNING] [a] last words")
    merger.feed(0, "[rank 0] [12:00:03] [INFO] [a] still in order")
    merger.feed(None, "worker rank 0 (local rank 0) on vm died: exited with status 1")
    merger.close()
    assert out.getvalue().splitlines()[5:] == [
        "[rank 1] [12:00:03] [INFO] [a] nothing held for rank 1",
        "[rank 0] [12:00:03] [WARNING] [a] last words", "[rank 0] [12:00:03] [INFO] [a] still in order",
        "worker rank 0 (local rank 0) on vm died: exited with status 1"]


def test_a_ranks_stdout_lines_wait_behind_its_held_warning_and_go_to_stdout():
    """The training log's rows (stdout) of a rank whose warning is held (a load's 'resharded'
    warning, on stderr) come after it, not before: in a short run they would otherwise print
    before the warning that came first. Other ranks' stdout lines pass at once."""
    seen: list[tuple[str, str]] = []

    class Stream(io.StringIO):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def write(self, text):
            seen.extend((self.name, line) for line in text.splitlines())
            return len(text)

    err, out = Stream("stderr"), Stream("stdout")
    merger = WarningMerger(err, range(2), window=0.3)
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] resharded into this layout")
    merger.feed_plain(0, " iteration 1/2 | lm_loss 7.1", out)
    merger.feed_plain(1, "rank 1's own print", out)
    merger.feed(0, "[rank 0] [12:00:02] [INFO] [a] saved checkpoint")
    merger.feed_plain(0, "run finished at iteration 2/2", out)
    assert seen == [("stdout", "rank 1's own print")]
    time.sleep(0.6)
    merger.close()
    assert seen[1:] == [("stderr", "[rank 0] [12:00:01] [WARNING] [a] resharded into this layout"),
                        ("stdout", " iteration 1/2 | lm_loss 7.1"),
                        ("stderr", "[rank 0] [12:00:02] [INFO] [a] saved checkpoint"),
                        ("stdout", "run finished at iteration 2/2")]


def test_the_error_workers_end_on_is_printed_once_with_their_ranks_and_hosts():
    out = io.StringIO()
    merger = WarningMerger(out, range(4), window=0.3)
    merger.feed(0, "error (rank 0 on node-a): unknown lm-eval task 'x'")
    merger.feed(1, "error (rank 1 on node-a): unknown lm-eval task 'x'")
    assert out.getvalue() == ""  # held until every rank said it, or the window passed
    merger.feed(None, "node-b: error (ranks 2-3 on node-b): unknown lm-eval task 'x'")  # pdsh
    merger.feed(2, "error (rank 2 on node-b): data file d.bin is gone")
    merger.flush()  # what is held comes out now (before a death is reported)
    assert out.getvalue().splitlines() == [
        "error (ranks 0-3 on node-a, node-b): unknown lm-eval task 'x'",
        "error (rank 2 on node-b): data file d.bin is gone"]
    merger.feed(None, "node-a: error (rank 1 on node-a): out of memory")
    merger.feed(None, "node-a: worker rank 1 (local rank 1) on node-a died: exited with status 1")
    assert out.getvalue().splitlines()[2:] == [  # the error held comes before the death
        "node-a: error (rank 1 on node-a): out of memory",
        "node-a: worker rank 1 (local rank 1) on node-a died: exited with status 1"]
    merger.close()


def test_an_error_of_several_lines_is_printed_once_for_the_ranks_whose_lines_are_alike():
    """A worker's error may go on over further lines (a damaged checkpoint's list of files):
    they belong to it, and ranks whose whole message is alike share one copy; a rank whose
    further lines differ gets its own."""
    out = io.StringIO()
    merger = WarningMerger(out, range(4), window=5)
    damaged = ["error (rank {r} on node-{h}): checkpoint c/global_step2 is damaged:",
               "  - c/global_step2/layer_00.pt: sha256 90cc... differs from the manifest's",
               "Restore the files from a backup or pick another checkpoint with iteration=<N>"]
    for r, h in ((0, "a"), (1, "a")):
        for line in damaged:
            merger.feed(r, line.format(r=r, h=h))
    for line in damaged[:1] + ["  - c/global_step2/layer_01.pt: missing", damaged[2]]:
        merger.feed(None, "node-b: " + line.format(r=2, h="b"))  # relayed by pdsh
    merger.feed(None, "node-b: [rank 3] [12:00:01] [INFO] [a] not part of it")
    assert out.getvalue().splitlines() == ["node-b: [rank 3] [12:00:01] [INFO] [a] not part of it"]
    merger.feed(None, "node-b: worker rank 2 (local rank 0) on node-b died: exited with status 1")
    assert out.getvalue().splitlines()[1:] == [
        "error (ranks 0-1 on node-a): checkpoint c/global_step2 is damaged:",
        damaged[1], damaged[2],
        "error (rank 2 on node-b): checkpoint c/global_step2 is damaged:",
        "  - c/global_step2/layer_01.pt: missing", damaged[2],
        "node-b: worker rank 2 (local rank 0) on node-b died: exited with status 1"]
    merger.feed(3, "error (rank 3 on node-b): out of memory")  # alone: as it came
    merger.feed(3, "  while building layer 3")
    merger.flush()
    merger.feed(3, "  a line after it was printed")
    merger.close()
    assert out.getvalue().splitlines()[8:] == ["error (rank 3 on node-b): out of memory",
                                               "  while building layer 3",
                                               "  a line after it was printed"]



def test_errors_interleaved_in_a_stream_that_mixes_ranks_are_printed_once():
    """mpirun's one stream: rank 0's error starts before rank 1's last line came, so that line
    and rank 0's own last line both follow rank 0's first lines. The message is printed once for
    both ranks, its last line once; a copy that is only cut short joins the whole one too."""
    out = io.StringIO()
    merger = WarningMerger(out, range(3), window=5)
    first = "no checkpoint in ck can be loaded:"
    body = ["  global_step30:", "    - ck/global_step30/layer_02.pt: sha256 7009... differs",
            "Restore the files from a backup, or remove `load` to start from scratch"]
    for line in [f"error (rank 1 on vm): {first}", *body[:2], f"error (rank 0 on vm): {first}",
                 *body[:2], body[2], body[2], f"error (rank 2 on vm): {first}", body[0]]:
        merger.feed(None, line)
    merger.close()
    assert out.getvalue().splitlines() == [f"error (ranks 0-2 on vm): {first}", *body]
    out = io.StringIO()
    merger = WarningMerger(out, range(2), window=5)
    for r, lines in ((0, body[:2]), (1, body[:1] + ["  global_step20: missing"])):
        for line in (f"error (rank {r} on vm): {first}", *lines):
            merger.feed(r, line)
    merger.close()  # neither begins the other: a copy each
    assert out.getvalue().splitlines() == [
        f"error (rank 0 on vm): {first}", *body[:2],
        f"error (rank 1 on vm): {first}", body[0], "  global_step20: missing"]

def test_warnings_two_ranks_print_in_opposite_orders_come_out_when_the_window_passes():
    out = io.StringIO()
    merger = WarningMerger(out, range(2), window=0.3)
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] A")
    merger.feed(0, "[rank 0] [12:00:01] [WARNING] [a] B")
    merger.feed(1, "[rank 1] [12:00:01] [WARNING] [a] B")
    merger.feed(1, "[rank 1] [12:00:01] [WARNING] [a] A")
    assert out.getvalue() == ""  # neither is the next line of both ranks
    time.sleep(0.6)
    assert out.getvalue().splitlines() == ["[ranks 0-1] [12:00:01] [WARNING] [a] A",
                                           "[ranks 0-1] [12:00:01] [WARNING] [a] B"]
    merger.close()


# as a worker's stderr shows it when torch's store client cannot reach the master (torch 2.13)
CPP_ERROR = """\
[W1127 07:35:40.796798426 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 127.0.0.1:27931 - retrying (try=0, timeout=6000ms, delay=4598ms): The client socket has timed out after 6000ms while trying to connect to (127.0.0.1, 27931).
Exception raised from throwTimeoutError at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/socket.cpp:1030 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >) + 0x9d (0x7fe7a6979b8d in /venv/lib/python3.11/site-packages/torch/lib/libc10.so)
frame #8: c10d::TCPStore::TCPStore(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >, c10d::TCPStoreOptions const&) + 0x41d (0x7fe79854534d in /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)
<omitting python frames>
frame #48: _start + 0x21 (0x557e23573081 in .venv/bin/python)
node-b: frame #3: <unknown function> + 0x163b752 (0x7fe79343b752 in libtorch_cpu.so)

[rank 1] [07:35:46] [ERROR] [megatron.mpu.initialize] rank 1 could not join
"""


def test_a_cpp_backtrace_after_a_torch_error_line_is_left_out_unless_asked_for():
    for shown in (False, True):
        out = io.StringIO()
        merger = WarningMerger(out, [1], window=0.1, cpp_backtraces=shown)
        for line in CPP_ERROR.splitlines():
            merger.feed(1, line)
        merger.close()
        lines = out.getvalue().splitlines()
        if shown:
            assert lines == CPP_ERROR.splitlines()
        else:
            assert lines == [CPP_ERROR.splitlines()[0], "",
                             "[rank 1] [07:35:46] [ERROR] [megatron.mpu.initialize] rank 1 could "
                             "not join"], lines


def test_torch_show_cpp_stacktraces_keeps_the_backtrace(monkeypatch):
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    assert WarningMerger(io.StringIO(), [0]).cpp_backtraces
    monkeypatch.delenv("TORCH_SHOW_CPP_STACKTRACES")
    assert not WarningMerger(io.StringIO(), [0]).cpp_backtraces


def test_a_pipe_passes_lines_through_the_merger_and_progress_bars_as_they_are():
    r, w = os.pipe()
    os.write(w, "a line\n\rbar 1/2 █".encode())
    os.write(w, "\rbar 2/2 ██\nafter\n[rank 0] [12:00:00] [WARNING] [x] w\n".encode())
    os.close(w)
    out = io.StringIO()
    merger = WarningMerger(out, [0, 1], window=0.1)
    pipe_lines(r, out, merger, 0)
    merger.close()
    assert out.getvalue() == ("a line\n\rbar 1/2 █\rbar 2/2 ██\nafter\n"
                              "[rank 0] [12:00:00] [WARNING] [x] w\n")

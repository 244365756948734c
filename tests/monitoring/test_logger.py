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

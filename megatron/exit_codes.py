"""Exit codes a worker chooses so that its launcher, and `megatron.restart`, can tell why it
stopped. A leaf module: any subpackage may import it without joining an import cycle."""

TIMED_OUT = 124  # as coreutils' `timeout`: the job ran out of time (hang watchdog, rendezvous)

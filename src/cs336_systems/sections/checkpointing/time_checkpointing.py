"""gradient_checkpointing (b) (assignment §2): one LM step with one level of recomputation, k
blocks per checkpoint: its peak memory and its step time.

    python -m cs336_systems.sections.checkpointing.time_checkpointing --size 2.7b --context-length 2048 \
        --mode forward-backward --checkpoint-block-size 4 --output r.json

Leave out `--checkpoint-block-size` for no checkpointing. The job builds the step
(`build_lm_step`: the model's `checkpoint_block_size`, non-reentrant `torch.utils.checkpoint`),
runs the warm-up steps, then times the measured steps with the harness inside a peak window
(`memory.peak_window`: the CUDA allocator's peak, reset after the warm-up). On a CPU the peak
comes from one more step under the live-tensor stand-in (`memory.LiveBytes`), which would slow
the timed ones. The record holds the memory in use at the start
(`start_gib`: parameters, and optimizer state in train-step), the peak (`peak_gib`), where the
peak was read (`peak_source`), the parameters' gradient bytes (allocated during every backward)
and the step times. An out-of-memory is a result: the record gets status `oom` with what was
known before it.
"""

from __future__ import annotations

from cs336_systems.pipeline.cli import record_run, section_parser
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.sections.checkpointing.recompute import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    add_lm_step_arguments(parser, warmup_steps=2, measure_steps=3)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    if args.mode == "forward":
        parser.error("--mode forward runs without gradients, so there is nothing to recompute: "
                     "checkpointing needs a backward pass (use forward-backward or train-step)")
    return record_run("checkpointing", args, measure)


if __name__ == "__main__":
    main()


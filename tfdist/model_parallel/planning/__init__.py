"""Planning a pipeline before it runs: pure arithmetic over measured or counted costs.

- `profile`: each layer call's measured time, activation and weight bytes;
- `simulate`: a schedule run on paper (each action's start and end);
- `planner`: each schedule's predicted step, bubble and peak bytes per device;
- `memory_plan`: what each stage process will hold, against its memory limit;
- `auto`: `--schedule auto`, the fastest predicted schedule that fits.

What runs a planned pipeline is one level up (`pipeline`, `pipeline_model`,
`stage`, `stage_step`, `schedules`, `update_order`).
"""

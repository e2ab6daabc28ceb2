"""`python -m tfdist.bench SUBCOMMAND --out DIR`: tfdist measures itself.

Each subcommand is a module here with::

    DESCRIPTION = "one line"
    def add_arguments(parser): ...          # its own flags
    def run(args) -> dict: ...              # measures; returns JSON-able results
    def table(result) -> str: ...           # readable summary printed to stdout
    def plot(result, fig): ...              # draws onto a matplotlib Figure

and is registered in `SUBCOMMANDS`. The runner writes DIR/SUBCOMMAND.json
(atomically) and DIR/SUBCOMMAND.png and prints the table. Ratios are always
measured side by side in one run.
"""

SUBCOMMANDS: dict[str, str] = {
    # name -> module; imported lazily so one benchmark's deps never load another's.
    "pipeline": "tfdist.bench.pipeline",
    "pipeline-processes": "tfdist.bench.pipeline_processes",
    "horovod-allreduce": "tfdist.bench.horovod_allreduce",
    "async": "tfdist.bench.async_ps",
    "scaling": "tfdist.bench.scaling",
    "allreduce": "tfdist.bench.allreduce",
    "overhead": "tfdist.bench.overhead",
    "collectives": "tfdist.bench.collectives",
    "comm": "tfdist.bench.comm",
    "overlap": "tfdist.bench.overlap",
    "zero": "tfdist.bench.zero",
    "memory-cap": "tfdist.bench.memory_cap",
    "signals": "tfdist.bench.signals",
}

"""`python -m tfdist.bench SUBCOMMAND --out DIR [flags]`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tfdist.bench import SUBCOMMANDS, report


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(prog="python -m tfdist.bench")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    modules = {}
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        p = sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        p.add_argument("--out", default="bench_out", help="directory for NAME.json and NAME.png")
        p.add_argument("--keep-runs", action="store_true",
                       help="keep each training run's model dir (model.keras, backups, "
                            "metrics.json) under OUT/runs; by default each is removed once its "
                            "figures are read")
        module.add_arguments(p)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.command:
        parser.error(f"choose a SUBCOMMAND: {sorted(SUBCOMMANDS)}")
    module = modules[args.command]
    result = module.run(args)
    json_path, png_path = report.write(args.out, args.command, result, module.plot)
    print(module.table(result))
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``comfyquant check``: every defect, and each runtime's verdict.

Every report is built by ``comfyquant.checker.run.build_report``, as for ``comfyquant.check``;
URLs are opened with the remote options (``--gap``, ``--timeout``, see
``comfyquant.io.remote``); ``--recursive`` and a folder of separate checkpoints go through
``comfyquant.checker.batch``.  Nothing here imports urllib or fsspec for local paths.
"""

from __future__ import annotations

import json

from ..io.timeouts import MAX_TIMEOUT, MIN_TIMEOUT
from .common import number
from .streams import say

HELP = "find every defect and predict each runtime's verdict"
PATHS_HELP = "file(s), folder, *.safetensors.index.json, or URL(s): https://, s3://, gs://, hf:// ..."


def add_remote_arguments(parser) -> None:
    """``--gap`` and ``--timeout`` (shared with ``inspect``)."""
    parser.add_argument(
        "--gap",
        type=number(int, 0),
        metavar="BYTES",
        help="remote: read markers closer than BYTES with one request (default 65536)",
    )
    parser.add_argument(
        "--timeout",
        type=number(float, MIN_TIMEOUT, MAX_TIMEOUT),
        metavar="S",
        help="remote: seconds the whole read of a checkpoint may take, every request, retry and shard included (default 30)",
    )


def remote_options(args, roots: list[str]):
    """``RemoteOptions`` from the arguments when a root is a URL, else None (no import)."""
    from ..io.shards import is_url

    if not any(is_url(p) for p in roots):
        return None
    from ..io.remote import RemoteOptions

    opts = RemoteOptions()
    if args.gap is not None:
        opts.gap = args.gap
    if args.timeout is not None:
        opts.timeout = args.timeout
    return opts


def add_parser(sub) -> None:
    from .common import add_target_argument

    c = sub.add_parser("check", help=HELP, description=HELP)
    c.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
    add_target_argument(c, "runtime(s) whose rules decide severity")
    c.add_argument("--deep", action="store_true", help="also read scales, codebooks and corrections (never weights)")
    c.add_argument("--json", action="store_true", help="print the report as JSON (schema 1)")
    c.add_argument("--strip-prefix", metavar="P", help="map layer names by removing prefix P (e.g. model.diffusion_model.)")
    c.add_argument("-v", "--verbose", action="store_true", help="also list info findings and I/O counts")
    c.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help="check every checkpoint under each folder: one summary line each, then a table",
    )
    c.add_argument(
        "-j",
        "--jobs",
        type=number(int, 1),
        default=1,
        metavar="N",
        help="with --recursive: check N checkpoints at a time (threads, for remote I/O)",
    )
    add_remote_arguments(c)


def run(args) -> int:
    from .common import name_mapper

    mapper = name_mapper(args.strip_prefix)
    remote = remote_options(args, args.paths)
    if args.recursive:
        return _run_recursive(args, mapper, remote)
    from ..checker.run import CheckOptions, build_report
    from ..io.shards import SeparateCheckpoints

    try:
        # the process ends right after the report (the console entry skips interpreter teardown)
        report = build_report(args.paths, CheckOptions(args.target, args.deep, mapper, remote), exiting=True)
    except SeparateCheckpoints as separate:
        return _run_each(args, separate, mapper, remote)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        from ..render import render_report

        print(render_report(report, verbose=args.verbose))
    return 0 if report.ok else 1


def _run_each(args, separate, mapper, remote) -> int:
    """A folder (or list) of separate checkpoints: a full report for each, then the table of
    ``--recursive``; the exit code is the worst (2 unreadable, 1 errors, 0 ok)."""
    from ..checker.batch import check_groups
    from ..checker.run import CheckOptions

    printer = None
    if not args.json:
        from ..render import render_section

        print(separate.note)

        def printer(item) -> None:
            print(render_section(item, verbose=args.verbose), flush=True)

    options = CheckOptions(args.target, args.deep, mapper, remote)
    result = check_groups(args.paths, separate.groups, options, on_result=printer)
    for item in result.items:
        if item.error:
            say(f"comfyquant: {item.error}")
    if args.json:
        print(json.dumps({**result.to_dict(), "note": separate.note}, indent=1))
    else:
        from ..render import render_summary

        print(render_summary(result, verbose=args.verbose))
    return result.exit_code


def _run_recursive(args, mapper, remote) -> int:
    from ..checker.batch import check_tree

    printer = None
    if not args.json:
        from ..render import render_summary_line

        def printer(item) -> None:
            print(render_summary_line(item, verbose=args.verbose), flush=True)

    result = check_tree(
        args.paths, target=args.target, deep=args.deep, name_mapper=mapper, jobs=args.jobs, remote=remote, on_result=printer
    )
    for item in result.items:
        if item.error:
            say(f"comfyquant: {item.error}")
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        from ..render import render_summary

        print(render_summary(result, verbose=args.verbose))
    return result.exit_code

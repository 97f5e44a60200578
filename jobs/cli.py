"""The `quorum` command.

    quorum run CONFIG.yaml [key=value ...] [--no-resume]    run the job named by the config's `job:` key
    quorum submit CONFIG.yaml [key=value ...] [--address URL] [--follow]   run it on a Ray cluster (jobs/submit.py)
    quorum eval --metrics sari,bleu --orig O --sys S --refs R1 R2 ...   corpus metrics (see eval/cli.py)
    quorum serve CONFIG.yaml [key=value ...]                 start / update the reward-model Serve app
    quorum human export RUN_DIR --out DIR | import DIR A.csv ...   blind human-rating sheet out, ratings in
    quorum curve RUN_DIR ... --out DIR                        SARI vs training rows over runs (paper 000 Fig. 3)
    quorum simplify-doc FILE [--configuration C] [--html OUT] [key=value ...]   one document through AgentSimp
    quorum stage-models CONFIG.yaml [key=value ...] [--list]  download the config's hf: models into ray.models.hf_home
    quorum plan CONFIG.yaml [key=value ...] [--cluster FILE]  nodes, GPU memory, timeouts, storage on the cluster; no Ray
    quorum data list | get NAME --to DIR [--accept-licence]    the corpora the jobs read; fetch and verify one

Exit codes: 0 success, 2 bad config or bad input (the message names the key, file or line), 1 anything else.
"""

from __future__ import annotations

import sys

from core.config import ConfigError
from jobs.entry import INPUT_ERRORS, JOBS, job_module, run_job  # noqa: F401 (JOBS, job_module: callers of jobs.cli)

USAGE = __doc__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "run":
            if not rest:
                raise ConfigError("quorum run: missing CONFIG.yaml")
            return run_job(job_module(rest[0]), rest)
        if command == "eval":
            from eval.cli import main as eval_main

            return eval_main(rest)
        if command == "curve":
            from jobs.curve_cli import main as curve_main

            return curve_main(rest)
        if command == "human":
            from jobs.human_cli import main as human_main

            return human_main(rest)
        if command == "simplify-doc":
            from jobs.simplify_doc_cli import main as simplify_doc_main

            return simplify_doc_main(rest)
        if command == "serve":
            from jobs.serve_grm import main as serve_main

            return serve_main(rest)
        if command == "submit":
            from jobs.submit import main as submit_main

            return submit_main(rest, job_module)
        if command == "data":
            from jobs.data_cli import main as data_main

            return data_main(rest)
        if command == "plan":
            from jobs.plan import main as plan_main

            return plan_main(rest)
        if command == "stage-models":
            from jobs.stage_models import main as stage_models_main

            return stage_models_main(rest, job_module)
        raise ConfigError(f"unknown command {command!r}; expected run, eval, human, curve, simplify-doc, serve, submit, stage-models or data")
    except ConfigError as exc:
        print(f"quorum: error: {exc}", file=sys.stderr)
        return 2
    except INPUT_ERRORS as exc:
        print(f"quorum: input error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

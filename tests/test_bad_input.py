"""Bad input that used to get in (issue 34): a key twice in YAML or in a JSON Lines row, a source empty once
normalised, references that do not match the corpus, and a stage asking for more than the cluster can ever give.

Items 1-4 run `quorum run` (the CLI's `main`) on the demo job with one bad file: exit 2 before Ray starts
(`ray.init` is replaced by a tripwire), the message names the file and the line (or the key), and no run directory
is left behind. Item 5 asks a real local Ray cluster for a training worker group or an actor pool it cannot hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo.yaml"
CORPUS = REPO / "configs" / "data" / "demo_corpus.jsonl"
REFERENCES = REPO / "configs" / "data" / "demo_references.jsonl"


@pytest.fixture
def no_ray(monkeypatch):
    """Any attempt to start or join Ray fails the test: bad input must stop the job before it."""
    import ray

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was refused")

    monkeypatch.setattr(ray, "init", tripwire)


def run_demo(tmp_path: Path, capsys, *overrides: str, config: Path = DEMO) -> tuple[int, str]:
    code = cli_main(["run", str(config), f"run.root={tmp_path / 'runs'}", *overrides])
    return code, capsys.readouterr().err


def assert_no_run_dir(tmp_path: Path) -> None:
    assert not (tmp_path / "runs").exists(), sorted(p.name for p in (tmp_path / "runs").rglob("*"))


def corpus_with(tmp_path: Path, *bad_lines: str, name: str = "corpus.jsonl") -> Path:
    """The demo corpus's first lines, then `bad_lines` (line numbers: the bad ones are 4, 5, ...)."""
    path = tmp_path / name
    good = CORPUS.read_text(encoding="utf-8").splitlines()[:3]
    path.write_text("\n".join([*good, *bad_lines]) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# 1. YAML: a key twice, in a config and in a prompt template


def test_config_with_a_key_twice_is_refused_naming_both_lines(tmp_path, capsys, no_ray):
    lines = DEMO.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("max_steps:")) + 1
    lines.insert(first, "    max_steps: 2")  # right below the first one, same section (train.trainer)
    config = tmp_path / "demo_twice.yaml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, err = run_demo(tmp_path, capsys, config=config)
    assert code == 2, err
    assert f"{config}: line {first + 1}: key 'max_steps' appears twice (first at line {first})" in err, err
    assert_no_run_dir(tmp_path)


def test_prompt_template_with_a_key_twice_is_refused_naming_file_and_lines(tmp_path, capsys, no_ray):
    template = tmp_path / "lexical_twice.yaml"
    text = (REPO / "configs" / "prompts" / "simplify_lexical.yaml").read_text(encoding="utf-8")
    template.write_text(text + "description: a second description\n", encoding="utf-8")
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("description:"))
    code, err = run_demo(tmp_path, capsys, f"policies.lexical={template}")
    assert code == 2, err
    last = len(text.splitlines()) + 1
    assert f"policies.lexical: {template}: line {last}: key 'description' appears twice (first at line {first})" \
        in err, err
    assert_no_run_dir(tmp_path)


def test_override_value_with_a_key_twice_is_refused():
    from core.config import ConfigError, apply_override

    with pytest.raises(ConfigError, match=r"override generate\.0\.pool\.resources: .*key 'a' appears twice"):
        apply_override({}, "generate.0.pool.resources={a: 1, a: 2}")


def test_yaml_merge_keys_may_still_be_overridden():
    from core.files import load_yaml

    assert load_yaml("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  x: 3\n")["use"] == {"x": 3, "y": 2}


# ---------------------------------------------------------------------------------------------------------------
# 2. JSON Lines: a key twice in one row


def test_jsonl_row_with_a_key_twice_is_refused_naming_file_and_line(tmp_path, capsys, no_ray):
    corpus = corpus_with(tmp_path, '{"id": "a", "text": "x y z", "text": "a b c"}')
    code, err = run_demo(tmp_path, capsys, f"data.path={corpus}", "data.references_path=")
    assert code == 2, err
    assert f"{corpus}: line 4: key 'text' appears twice in one object" in err, err
    assert_no_run_dir(tmp_path)


def test_duplicate_keys_are_refused_in_nested_objects_and_every_jsonl_reader(tmp_path):
    from core.errors import CorpusError
    from eval.agentsimp.docs import read_corpus as read_documents_jsonl
    from eval.judging.menlo_data import MenloDataError, read_menlo_jsonl

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "d", "paragraphs": ["p"], "references": ["r"], "id": "e"}\n')
    with pytest.raises(CorpusError, match=r"docs\.jsonl: line 1: key 'id' appears twice"):
        read_documents_jsonl(docs)
    menlo = tmp_path / "menlo.jsonl"
    menlo.write_text('\n{"pair_id": "p", "meta": {"k": 1, "k": 2}}\n')
    with pytest.raises(MenloDataError, match=r"menlo\.jsonl: line 2.*key 'k' appears twice"):
        read_menlo_jsonl(menlo)


def test_blank_lines_and_crlf_between_jsonl_rows_are_accepted(tmp_path):
    """The documented leniency (docs/input-formats.md): blank lines are not rows, CRLF reads as LF."""
    from actors.corpus import read_corpus

    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "text": "one two"}\r\n\r\n\n{"id": "b", "text": "three"}\r\n')
    frame = read_corpus(path, id_column="id")
    assert list(frame["source"]) == ["one two", "three"]


# ---------------------------------------------------------------------------------------------------------------
# 3. Sources empty once normalised


@pytest.mark.parametrize("text, shown", [("\u200b\u200b", r"'\u200b\u200b'"), ("\x00", r"'\x00'"),
                                         (" \u2060\ufeff\x1b ", r"' \u2060\ufeff\x1b '")])
def test_source_empty_once_normalised_is_refused_like_an_empty_one(tmp_path, capsys, no_ray, text, shown):
    corpus = corpus_with(tmp_path, json.dumps({"id": "blank", "text": text}))
    code, err = run_demo(tmp_path, capsys, f"data.path={corpus}", "data.references_path=")
    assert code == 2, err
    assert f"{corpus}: line 4: text column 'text' must be a non-empty string, got {shown} (only zero-width or " \
           "control characters)" in err, err
    assert_no_run_dir(tmp_path)


def test_normalising_keeps_ordinary_text_and_counts_what_it_changed(tmp_path):
    from actors.corpus import read_asset, read_corpus

    corpus = corpus_with(tmp_path, json.dumps({"id": "z", "text": "Cafe\u0301 o\x00pen\u200b now"}))
    frame = read_corpus(corpus, id_column="id")
    originals = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()[:3]]
    assert list(frame["source"]) == [*originals, "Café open now"]
    assert frame.attrs["normalised_rows"] == 1
    asset = REPO.parent / "shared" / "data" / "asset"
    if asset.is_dir():  # the real data sets hold no such characters: their texts are read byte for byte
        frame = read_asset(asset, limit=200)
        raw = (asset / "asset.valid.orig").read_text(encoding="utf-8").split("\n")[:200]
        assert list(frame["source"]) == raw


def test_aligned_data_set_line_empty_once_normalised_is_refused(tmp_path):
    from actors.corpus import read_turkcorpus
    from core.errors import CorpusError

    stem = tmp_path / "tune.8turkers.tok"
    Path(f"{stem}.norm").write_text("a b c .\nd e f .\n")
    for k in range(8):
        Path(f"{stem}.turk.{k}").write_text("a b .\n\u200b\n" if k == 3 else "a b .\nd e .\n")
    with pytest.raises(CorpusError, match=r"turk\.3: line 2 is empty \(only zero-width or control characters\)"):
        read_turkcorpus(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# 4. References that do not match the corpus: refused before the run directory exists


def test_reference_to_an_unknown_source_is_refused_before_the_run_directory(tmp_path, capsys, no_ray):
    refs = tmp_path / "refs.jsonl"
    lines = REFERENCES.read_text(encoding="utf-8").splitlines()
    stray = json.loads(lines[1]) | {"id": "not-in-the-corpus"}
    refs.write_text("\n".join([lines[0], json.dumps(stray), *lines[2:]]) + "\n", encoding="utf-8")
    code, err = run_demo(tmp_path, capsys, f"data.references_path={refs}")
    assert code == 2, err
    assert f"{refs}: line 2: id 'not-in-the-corpus' is not in configs/data/demo_corpus.jsonl" in err, err
    assert_no_run_dir(tmp_path)


def test_source_without_a_reference_is_refused_before_the_run_directory(tmp_path, capsys, no_ray):
    refs = tmp_path / "refs.jsonl"
    lines = REFERENCES.read_text(encoding="utf-8").splitlines()
    refs.write_text("\n".join(lines[:5] + lines[6:]) + "\n", encoding="utf-8")  # demo-006 has none
    code, err = run_demo(tmp_path, capsys, f"data.references_path={refs}")
    assert code == 2, err
    assert f"data.references_path: {refs}: source 'demo-006' of configs/data/demo_corpus.jsonl has no reference " \
           "for policies ['lexical', 'overall']" in err, err
    assert_no_run_dir(tmp_path)


def test_references_row_with_a_key_twice_is_refused_before_the_run_directory(tmp_path, capsys, no_ray):
    refs = tmp_path / "refs.jsonl"
    lines = REFERENCES.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][:-1] + ', "id": "demo-004"}'
    refs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, err = run_demo(tmp_path, capsys, f"data.references_path={refs}")
    assert code == 2, err
    assert f"{refs}: line 3: key 'id' appears twice in one object" in err, err
    assert_no_run_dir(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# 5. A stage asking for more than the cluster can ever grant


def test_training_worker_group_too_big_for_the_cluster_is_refused_at_once(ray_local, tmp_path):
    """ray_local has 2 CPUs and no autoscaler: 3 workers × 1 CPU can never be placed (Ray Train would wait)."""
    from core.config import ConfigError
    from train.config import TrainConfig
    from train.preference.trainer import run_training

    cfg = TrainConfig(num_workers=3, micro_batch_size=1, max_steps=1)
    rows = [{"prompt_messages": [{"role": "user", "content": "x"}], "chosen": "a", "rejected": "b"}] * 3
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        run_training(cfg, rows, run_dir=str(tmp_path / "run"), where="train.trainer")
    assert time.monotonic() - started < 60
    assert str(err.value) == ("training: 3 workers × 1 CPU = 3 CPU, but the cluster has 2 CPU in all, and no "
                              "autoscaler to add nodes. Change train.trainer.num_workers or "
                              "train.trainer.cpus_per_worker, or give the cluster more")


def test_entrypoint_reservation_counts_against_the_stage(ray_local, monkeypatch):
    """The issue's case: `ray job submit --entrypoint-num-cpus 0.25` on a 2-CPU head leaves 1.75 CPU for 2 × 1 CPU.

    The job's record is written where Ray's job manager writes it (`JobInfoStorageClient.JOB_DATA_KEY`), and the
    driver's environment names the submission as Ray's job supervisor sets it."""
    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray.dashboard.modules.job.common import JobInfoStorageClient
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    from actors.ray_capacity import capacity, ensure_fits
    from core.config import ConfigError
    from core.resource_fit import Ask

    key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id="raysubmit_q34")
    _internal_kv_put(key, json.dumps({"entrypoint": "quorum run configs/demo.yaml", "entrypoint_num_cpus": 0.25}),
                     namespace=KV_NAMESPACE_JOB)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"metadata": {"job_submission_id": "raysubmit_q34"}}))
    try:
        assert capacity().held == {"CPU": 0.25}
        with pytest.raises(ConfigError, match=r"training: 2 workers × 1 CPU = 2 CPU, but the cluster has 2 CPU in "
                                              r"all, 0\.25 of them held by this job's driver .*: 1\.75 CPU for the "
                                              r"stage, and no autoscaler"):
            ensure_fits(Ask("training", "workers", 2, {"CPU": 1.0}, ("train.trainer.num_workers",)))
        ensure_fits(Ask("training", "workers", 1, {"CPU": 1.0}))  # 1 CPU fits beside the reservation
    finally:
        _internal_kv_del(key, namespace=KV_NAMESPACE_JOB)


def test_actor_pool_too_big_for_the_cluster_is_refused(ray_local):
    from actors.stage_config import PoolConfig
    from core.config import ConfigError

    with pytest.raises(ConfigError, match=r"actor pool of model 'judge': 2 actors × 1\.5 CPU = 3 CPU, but the "
                                          r"cluster has 2 CPU in all, and no autoscaler to add nodes\. Change "
                                          r"pool\.concurrency or pool\.num_cpus"):
        PoolConfig(concurrency=2, num_cpus=1.5).map_batches_kwargs("judge")
    with pytest.raises(ConfigError, match=r"1 actor × \{0\.5 CPU, 1 gpu_slot\} = 0\.5 CPU, 1 gpu_slot, but the cluster "
                                          r"has 0 gpu_slot in all, and no autoscaler .* Change pool\.concurrency or "
                                          r"pool\.num_cpus or pool\.resources"):
        PoolConfig(num_cpus=0.5, resources={"gpu_slot": 1}).map_batches_kwargs("judge")
    assert PoolConfig(concurrency=1, num_cpus=1.5).map_batches_kwargs("judge")["num_cpus"] == 1.5


def test_serve_replicas_too_big_for_the_cluster_are_refused(ray_local):
    from core.config import ConfigError
    from serve.app import check_replicas_fit
    from serve.config import AutoscalingConfig, ResourcesConfig, ServeConfig

    cfg = ServeConfig(autoscaling=AutoscalingConfig(min_replicas=2, max_replicas=4),
                      resources=ResourcesConfig(num_cpus=1.5))
    with pytest.raises(ConfigError, match=r"serve: 2 replicas × 1\.5 CPU = 3 CPU, but the cluster has 2 CPU in all"):
        check_replicas_fit(cfg)
    check_replicas_fit(ServeConfig(resources=ResourcesConfig(num_cpus=1.5)))  # one replica fits


@pytest.mark.slow
def test_quorum_run_on_a_cluster_too_small_for_training_exits_2_naming_the_numbers(tmp_path):
    """End to end: the demo's Parallel baseline (SFT on references: no model actor before training) on a local
    cluster of 1 CPU. Ray Train would wait for 2 × 1 CPU for ever; the job stops with exit 2 instead."""
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "run", str(DEMO), f"run.root={tmp_path / 'runs'}", "ray.num_cpus=1",
         "train.targets=references", "train.trainer.loss=sft", "evaluate.enabled=false", "wandb.mode=disabled"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "quorum: error: training: 2 workers × 1 CPU = 2 CPU, but the cluster has 1 CPU in all, and no " \
           "autoscaler to add nodes. Change train.trainer.num_workers or train.trainer.cpus_per_worker" in proc.stderr


WAIT_FOR_GPU_SLOT = """
import logging, sys
import ray
from actors.ray_capacity import ensure_fits
from core.resource_fit import Ask

logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
ray.init(address=sys.argv[1])
kind = ensure_fits(Ask("generate", "actors", 1, {"CPU": 0.5, "gpu_slot": 1}, ("pool.resources",)), limit_s=240).kind
with open(sys.argv[2], "w") as out:
    out.write(kind)
"""


@pytest.mark.slow
def test_a_stage_waits_for_the_autoscaler_then_goes_on(tmp_path):
    """On an autoscaling cluster (Ray's fake multi-node provider, cluster.yaml's node types) whose head has no
    `gpu_slot`, a pool asking for one is neither refused nor left hanging: the autoscaler is asked for the node,
    the stage waits for it (logged, bounded) and goes on once it has joined. Its own driver process, as a job's:
    this one keeps the session's `ray_local`.

    The driver writes its result to a file: Ray prints the autoscaler's events on the driver's stdout, and the new
    node's 3 s idle timeout can fire ("Removing 1 nodes of type gpu_worker (idle)") before a slower CPU's driver
    has exited, after anything the script printed (issue 43)."""
    from tests.fake_cluster import FakeCluster, mirrored_node_types

    fake = FakeCluster(mirrored_node_types(cpus=1), head_cpus=1, idle_timeout_minutes=0.05)
    result = tmp_path / "fits.txt"
    try:
        fake.start()
        proc = subprocess.run([sys.executable, "-c", WAIT_FOR_GPU_SLOT, fake.gcs_address, str(result)], check=False,
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and result.read_text() == "ok", proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "waiting for it to add nodes" in proc.stderr and "the cluster has room now" in proc.stderr
        # a gpu_slot node joined; its 3 s idle timeout may already have removed it again, so dead nodes count
        assert any(n["resources"].get("gpu_slot") for n in fake.nodes(dead_too=True))
    finally:
        fake.stop()

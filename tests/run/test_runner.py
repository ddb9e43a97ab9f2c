"""The experiment runner on tiny sizes: spec validation, failing cells, interrupt and
resume, the numbers it derives, and the CLI around it."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import pytest
import torch

from playground.cli import main
from playground.registry import Registry, configure
from playground.report.summary import exponents, scaling_fits, summarize, write_summary
from playground.run.cells import plan
from playground.run.jobs import AccuracyJob, prepare
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore

FLAKY_PLUGIN = """
    import playground

    Vanilla = playground.get_variant("vanilla")
    CALLS = {"interrupt_at": None}

    class Flaky(Vanilla):
        name = "flaky"
        summary = "vanilla that fails at n = 16 and can be told to raise Ctrl-C"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            if query.shape[1] == 16:
                raise RuntimeError("boom at n=16")
            if query.shape[1] == CALLS["interrupt_at"]:
                raise KeyboardInterrupt
            return super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)

    @playground.hookimpl
    def register_attention(register):
        register(Flaky)
"""

TINY = """
    name = "tiny"
    seq_lens = [8, 16, 24]
    d_model = 16
    num_heads = 2
    passes = ["forward", "forward_backward"]
    measures = ["speed", "memory", "fidelity"]

    [timing]
    min_run_time = 0.01
"""


@pytest.fixture
def registry(write_plugin):
    path = write_plugin("flaky.py", FLAKY_PLUGIN)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def spec_file(tmp_path):
    def write(body: str, extra: str = "") -> str:
        path = tmp_path / "spec.toml"
        path.write_text(textwrap.dedent(body) + textwrap.dedent(extra))
        return str(path)

    return write


# --- spec validation ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("seq_len = [8]\n", r"key 'seq_len': unknown key; did you mean 'seq_lens'\?"),
        ('batch_size = "two"\n', r"key 'batch_size': must be an integer"),
        ('dtype = "float8"\n', r"key 'dtype': 'float8' is not one of float32"),
        (
            'passes = ["backward"]\n',
            r"key 'passes': 'backward' is not one of forward, forward_backward",
        ),
        ('measures = ["accuracy"]\n', r"key 'tasks': measures include 'accuracy' but no tasks"),
        ('[[variants]]\nname = "vanila"\n', r"variants\[0\]\.name.*did you mean 'vanilla'"),
        (
            'baseline = "vanila"\n',
            r"key 'baseline': 'vanila' is not the label of one of the spec's setups; did you mean",
        ),
        (
            '[[variants]]\nname = "vanilla"\nwindow = 3\n',
            r"variants\[0\]: variant 'vanilla' has no option 'window'",
        ),
        (
            '[[variants]]\nname = "linformer"\nk = [8, "x"]\n',
            r"option 'k' of variant 'linformer' must be an integer",
        ),
        ('[[variants]]\nname = "longformer"\nattention_window = 3\n', r"variants\[0\].*even"),
        ("[timing]\nmin_runtime = 1\n", r"timing.min_runtime.*did you mean 'min_run_time'"),
    ],
)
def test_spec_errors_name_the_file_and_key(spec_file, extra, message):
    path = spec_file('name = "bad"\nseq_lens = [8]\nd_model = 16\nnum_heads = 2\n', extra)
    with pytest.raises(SpecError, match=message) as raised:
        load_spec(path, Registry.discover(entry_points=False))
    assert path in str(raised.value)


def test_d_model_must_divide_by_heads(spec_file):
    with pytest.raises(SpecError, match="not divisible by num_heads"):
        load_spec(
            spec_file(TINY.replace("num_heads = 2", "num_heads = 3")),
            Registry.discover(entry_points=False),
        )


def test_list_valued_options_sweep_but_tuples_are_values(spec_file):
    extra = """
        [[variants]]
        name = "linformer"
        seq_len = 64
        k = [4, 8]

        [[variants]]
        name = "longformer"
        attention_window = 4
        global_tokens = [0]

        [[variants]]
        name = "longformer"
        attention_window = 4
        global_tokens = [[1], [0, 1]]
    """
    spec = load_spec(spec_file(TINY, extra), Registry.discover(entry_points=False))
    labels = [v.label for v in spec.variants]
    assert labels[:2] == ["linformer(k=4, seq_len=64)", "linformer(k=8, seq_len=64)"]
    assert [v.options["global_tokens"] for v in spec.variants[2:]] == [[0], [1], [0, 1]]


def test_unset_variants_means_every_registered_one(spec_file, registry):
    spec = load_spec(spec_file(TINY), registry)
    assert sorted({v.name for v in spec.variants}) == registry.names()


def test_shipped_specs_are_valid():
    registry = Registry.discover(entry_points=False)
    for name in ("quick", "scaling", "linformer_k", "window"):
        spec = load_spec(name, registry)
        assert spec.name == name and plan(spec)


# --- running -----------------------------------------------------------------------
def run_tiny(registry, spec_file, tmp_path, **store):
    spec = load_spec(
        spec_file(TINY, '[[variants]]\nname = "vanilla"\n[[variants]]\nname = "flaky"\n'), registry
    )
    store = RunStore.create(tmp_path / "results", spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    return spec, store, runner


def test_a_failing_cell_is_recorded_and_the_sweep_goes_on(registry, spec_file, tmp_path):
    spec, store, runner = run_tiny(registry, spec_file, tmp_path)
    count, completed = runner.measure_pending()
    rows = store.rows()
    assert completed and count == len(plan(spec)) == len(rows) == 12
    failed = [r for r in rows if r["status"] != "ok"]
    assert {(r["variant"], r["seq_len"]) for r in failed} == {("flaky", 16)}
    assert all(r["status"] == "error" and "boom at n=16" in r["error"] for r in failed)
    ok = [r for r in rows if r["status"] == "ok"]
    for row in ok:
        assert row["time_ms"] > 0 and row["peak_memory_bytes"] > 0 and row["flops"] > 0
        assert row["efficiency"] == pytest.approx(
            row["flops"] / (row["time_ms"] / 1e3) / runner.gemm_flops
        )
    forward = [r for r in ok if r["pass"] == "forward"]
    assert all(
        r["fidelity_rel_error"] == 0 and r["fidelity_cosine"] == pytest.approx(1) for r in forward
    )
    env = json.loads(store.path("env.json").read_text())
    assert env["torch_version"] == torch.__version__ and env["gemm_flops_per_s"] > 0


def test_interrupt_then_resume_gives_every_row_once(registry, spec_file, tmp_path):
    spec, store, runner = run_tiny(registry, spec_file, tmp_path)
    module = sys.modules[registry.get("flaky").__module__]
    module.CALLS["interrupt_at"] = 24
    count, completed = runner.measure_pending()
    assert not completed
    kept = store.rows()
    assert len(kept) == count and 0 < count < len(plan(spec))
    module.CALLS["interrupt_at"] = None
    resumed = Runner(
        load_spec(store.path("spec.toml"), registry), registry, RunStore.existing(store.directory)
    )
    resumed.start()
    assert resumed.gemm_flops == runner.gemm_flops  # the run's own ceiling, not a new one
    resumed.measure_pending()
    cells = [row["cell"] for row in store.rows()]
    assert sorted(cells) == sorted(cell.id for cell in plan(spec))
    assert len(cells) == len(set(cells))


def row(cell: str, **fields) -> dict:
    """The fields every row of results.jsonl has, for a made-up cell."""
    base = {"cell": cell, "variant": "v", "label": "v", "status": "ok", "seq_len": 8}
    return {**base, "pass": "forward", **fields}


def test_a_line_cut_short_by_a_crash_is_ignored_and_replaced(tmp_path):
    store = RunStore.create(tmp_path, "x")
    store.append(row("a"))
    with open(store.path("results.jsonl"), "a") as file:
        file.write('{"cell": "b", "ti')
    assert store.rows() == [row("a")]
    store.append(row("b"))  # what a resume does next
    assert store.rows() == [row("a"), row("b")]


def test_two_runs_never_share_a_directory(tmp_path):
    directories = {RunStore.create(tmp_path, "same").directory for _ in range(3)}
    assert len(directories) == 3


def test_unsupported_cells_are_recorded_as_such(spec_file, tmp_path):
    registry = Registry.discover(entry_points=False)
    spec = load_spec(
        spec_file(TINY, '[[variants]]\nname = "linformer"\nseq_len = 16\nk = 4\n'), registry
    )
    store = RunStore.create(tmp_path, spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    runner.measure_pending()
    statuses = {(r["seq_len"], r["status"]) for r in store.rows()}
    assert statuses == {(8, "ok"), (16, "ok"), (24, "unsupported")}
    assert "seq_len=16" in next(r["error"] for r in store.rows() if r["status"] == "unsupported")


# --- derived numbers -----------------------------------------------------------------
def synthetic_rows(label, times, memories, status="ok"):
    return [
        {
            "label": label,
            "variant": label,
            "pass": "forward",
            "seq_len": n,
            "status": status,
            "time_ms": t,
            "peak_memory_bytes": m,
            "error": None,
        }
        for n, t, m in zip((1024, 2048, 4096), times, memories, strict=True)
    ]


def test_exponents_on_synthetic_timings():
    rows = synthetic_rows("quadratic", [1, 4, 16], [10, 20, 40])
    assert exponents(rows) == pytest.approx((2.0, 1.0))
    assert exponents(rows[:1]) == (None, None)


def test_summary_speedup_is_against_the_baseline_at_the_same_n():
    rows = synthetic_rows("vanilla", [2, 8, 32], [1, 4, 16]) + synthetic_rows(
        "fast", [1, 2, 4], [1, 2, 4]
    )
    lines = [line for line in summarize(rows, "vanilla") if line.label == "fast"]
    assert [line.speedup_vs_baseline for line in lines] == [2, 4, 8]
    assert all(line.speedup_vs_baseline is None for line in summarize(rows))  # no baseline
    assert lines[0].time_exponent == pytest.approx(1.0)


def test_failed_rows_do_not_enter_the_fit():
    rows = synthetic_rows("v", [1, 2, 4], [1, 2, 4])
    rows[2]["status"], rows[2]["time_ms"] = "oom", None
    # Two lengths left: a two-point slope, which the figures do not show as an exponent.
    assert exponents(rows)[0] is None
    time_fit, _ = scaling_fits(rows)
    assert time_fit.exponent == pytest.approx(1.0) and time_fit.stderr is None


# --- command line --------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def test_run_command_writes_rows_summary_and_env(spec_file, tmp_path, capsys):
    code = main(
        [
            "run",
            spec_file(TINY),
            "--variants",
            "vanilla",
            "--seq-lens",
            "8,16",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 0
    (run_dir,) = (tmp_path / "r" / "tiny").iterdir()
    assert {p.name for p in run_dir.iterdir()} >= {
        "results.jsonl",
        "env.json",
        "summary.csv",
        "spec.toml",
    }
    assert len(RunStore(run_dir).rows()) == 4
    out = capsys.readouterr().out
    assert "Scaling" in out and str(run_dir) in out


def test_resume_of_a_finished_run_runs_nothing(spec_file, tmp_path):
    main(
        ["run", spec_file(TINY), "--variants", "vanilla", "--seq-lens", "8", "--out", str(tmp_path)]
    )
    (run_dir,) = (tmp_path / "tiny").iterdir()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert len(RunStore(run_dir).rows()) == 2
    write_summary(RunStore(run_dir))


def test_cuda_without_a_gpu_is_a_clear_error_before_anything_runs(spec_file, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["run", spec_file(TINY), "--device", "cuda", "--out", str(tmp_path / "r")])
    assert code == 2 and "--device cpu" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_unknown_spec_lists_the_shipped_ones(capsys):
    assert main(["run", "quik"]) == 2
    err = capsys.readouterr().err
    assert "quick" in err and "scaling" in err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cuda_run(spec_file, tmp_path, dtype):
    registry = Registry.discover(entry_points=False)
    spec = load_spec(
        spec_file(
            TINY.replace('name = "tiny"', f'name = "tiny"\ndevice = "cuda"\ndtype = "{dtype}"')
        ),
        registry,
    )
    store = RunStore.create(tmp_path, spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    runner.measure_pending()
    rows = store.rows()
    assert rows and all(r["status"] in ("ok", "unsupported") for r in rows), rows
    assert any(r["status"] == "ok" and r["peak_memory_bytes"] > 0 for r in rows)


# --- accuracy cells ------------------------------------------------------------------
ACCURACY_SPEC = """
    name = "acc"
    measures = ["accuracy"]

    [[tasks]]
    name = "lookback"
    steps = 2
    seeds = 2

    [[variants]]
    name = "vanilla"

    [[variants]]
    name = "linformer"
    seq_len = 8
    k = 4
"""


def test_accuracy_cells_record_per_seed_results_and_unsupported(spec_file, tmp_path):
    registry = Registry.discover(entry_points=False)
    spec = load_spec(spec_file(ACCURACY_SPEC), registry)
    assert [cell.id for cell in plan(spec)] == [
        "vanilla|task=lookback",
        "linformer(k=4, seq_len=8)|task=lookback",
    ]
    store = RunStore.create(tmp_path, spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    runner.measure_pending()
    rows = {row["variant"]: row for row in store.rows()}
    vanilla, linformer = rows["vanilla"], rows["linformer"]
    assert vanilla["status"] == "ok" and len(vanilla["accuracy_per_seed"]) == 2
    assert vanilla["seeds"] == [0, 1] and vanilla["steps"] == 2 and vanilla["chance"] > 0
    # the task is longer than the 8 keys this Linformer was built for
    assert linformer["status"] == "unsupported" and "seq_len" in linformer["error"]
    write_summary(store)
    assert store.path("accuracy.csv").read_text().count("lookback") == 2


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "mqr"', r"tasks\[0\]\.name: no task named 'mqr'; did you mean 'mqar'"),
        ('name = "mqar"\nnum_pairs = "four"', r"tasks\[0\]: .*num_pairs"),
        ('name = "mqar"\nseeds = 0', r"tasks\[0\]\.seeds: must be a positive integer"),
        ('name = "mqar"\nd_model = 30\nnum_heads = 4', r"tasks\[0\]\.d_model: 30 is not divisible"),
        ('name = "mqar"\nbatch_size = 0', r"tasks\[0\]\.batch_size: must be a positive integer"),
        (
            'name = "mqar"\n[[tasks]]\nname = "mqar"\nd_model = 64',
            r"the task 'mqar' is listed more than once",
        ),
    ],
)
def test_task_tables_are_validated(spec_file, table, message):
    body = f'name = "acc"\nmeasures = ["accuracy"]\n[[tasks]]\n{table}\n'
    with pytest.raises(SpecError, match=message):
        load_spec(spec_file(body), Registry.discover(entry_points=False))


def test_one_task_at_two_widths_is_two_cells_and_batch_size_reaches_training(spec_file):
    """Zoology's accuracy-against-width: the same task at d_model 64 and 128 is two task
    runs, the second labelled with its width; a table's batch_size trains with it."""
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\n'
        '[[tasks]]\nname = "mqar"\nbatch_size = 8\n'
        '[[tasks]]\nname = "mqar"\nd_model = 128\n'
        '[[variants]]\nname = "vanilla"\n'
    )
    registry = Registry.discover(entry_points=False)
    spec = load_spec(spec_file(body), registry)
    assert [task.label for task in spec.tasks] == ["mqar", "mqar d_model=128"]
    cells = [cell for cell in plan(spec) if cell.task is not None]
    assert len({cell.id for cell in cells}) == len(cells) == 2
    job = AccuracyJob("vanilla", {}, "mqar", {}, batch_size=spec.tasks[0].batch_size)
    assert prepare(registry, job).training.batch_size == 8
    assert prepare(registry, AccuracyJob("vanilla", {}, "mqar", {})).training.batch_size == 32


def test_a_task_trains_only_the_variant_points_it_names(spec_file):
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\n'
        '[[tasks]]\nname = "mqar"\n'
        '[[tasks]]\nname = "mqar"\nseq_len = 128\nnum_pairs = 8\n'
        'variants = ["vanilla", "longformer(global_tokens=[0])"]\n'
        '[[variants]]\nname = "vanilla"\n[[variants]]\nname = "t5_relative"\n'
        '[[variants]]\nname = "longformer"\nglobal_tokens = [[], [0]]\n'
    )
    registry = Registry.discover(entry_points=False)
    cells = [cell.id for cell in plan(load_spec(spec_file(body), registry))]
    assert len(cells) == 4 + 2
    assert "longformer(global_tokens=[0])|task=mqar(seq_len=128, num_pairs=8)" in cells
    assert "longformer(global_tokens=[])|task=mqar(seq_len=128, num_pairs=8)" not in cells
    assert not any(c.startswith("t5_relative|task=mqar(seq_len=128") for c in cells)
    with pytest.raises(SpecError, match=r"tasks\[1\]\.variants': 'vanila' is none.*'vanilla'"):
        load_spec(
            spec_file(body.replace('variants = ["vanilla"', 'variants = ["vanila"')), registry
        )
    with pytest.raises(SpecError, match=r"tasks\[1\]\.variants: must be a non-empty list"):
        load_spec(
            spec_file(
                body.replace(
                    'variants = ["vanilla", "longformer(global_tokens=[0])"]', "variants = []"
                )
            ),
            registry,
        )


CURRICULUM_SPEC = """
    name = "curriculum"
    measures = ["accuracy"]
    accuracy_workers = 1

    [[tasks]]
    name = "mqar"
    seq_len = 24
    num_pairs = 4
    steps = 3
    seeds = 2
    curriculum = [{ seq_len = 12, num_pairs = 2, steps = 2, batch_size = 4 }]

    [[variants]]
    name = "vanilla"

    [[variants]]
    name = "linformer"
    k = 4
"""


def test_a_curriculum_trains_one_model_and_records_a_row_for_each_stage(spec_file, tmp_path):
    """Zoology's recipe: one model trained on the sizes in turn and scored on each; every
    stage is its own row, under a label that says it came after a curriculum."""
    registry = Registry.discover(entry_points=False)
    spec = load_spec(spec_file(CURRICULUM_SPEC), registry)
    (task,) = spec.tasks
    assert task.label == "mqar(seq_len=24) curriculum"
    assert task.stage_labels == ("mqar(seq_len=12, num_pairs=2) curriculum",)
    store = RunStore.create(tmp_path, spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    assert runner.measure_pending() == (2, True)
    rows = {row["cell"]: row for row in store.rows()}
    final, stage = (
        rows["vanilla|task=mqar(seq_len=24) curriculum"],
        rows["vanilla|task=mqar(seq_len=12, num_pairs=2) curriculum"],
    )
    assert final["status"] == stage["status"] == "ok"
    assert final["steps"] == 3 and stage["steps"] == 2 and stage["batch_size"] == 4
    assert stage["task_options"]["seq_len"] == 12 and final["task_options"]["seq_len"] == 24
    assert len(stage["accuracy_per_seed"]) == 2 and "stages" not in final
    assert [s["task_label"] for s in final["curriculum"]] == [
        "mqar(seq_len=12, num_pairs=2)",
        "mqar(seq_len=24)",
    ]
    # Linformer is not causal: refused once, recorded under every label the cell has
    refused = [row for row in rows.values() if row["variant"] == "linformer"]
    assert len(refused) == 2 and all(row["status"] == "unsupported" for row in refused)
    assert sorted(row["task_options"]["seq_len"] for row in refused) == [12, 24]
    assert runner.pending() == []  # a resume finds the cell done
    write_summary(store)
    assert store.path("accuracy.csv").read_text().count("curriculum") == 4


def test_a_curriculum_stage_trains_the_model_the_task_then_starts_from(registry):
    """The stage's steps reach the model: with them, the task's test score moves."""
    from playground.run.accuracy import train_seed
    from playground.run.curriculum import Stage

    base = AccuracyJob("vanilla", {}, "mqar", {"seq_len": 24}, steps=1, batch_size=4)
    staged = dataclasses.replace(
        base, curriculum=(Stage({"seq_len": 12, "num_pairs": 2}, steps=40, batch_size=16),)
    )
    alone = train_seed(registry, prepare(registry, base), seed=0)
    after = train_seed(registry, prepare(registry, staged), seed=0)
    assert alone.stage_scores == () and len(after.stage_scores) == 1
    assert prepare(registry, staged).model.max_seq_len == 24
    assert after.final_train_loss != alone.final_train_loss


def test_a_stage_generates_only_the_examples_its_schedule_draws(registry, monkeypatch):
    """A stage of 2 × 4 examples draws a test split's worth (1024), not the task's 40 000."""
    from playground.run.accuracy import train_seed
    from playground.run.curriculum import Stage
    from playground.tasks import Task

    asked = []
    split = Task.split

    def spy(self, seed, num_train=None, num_test=None):
        asked.append((self.label, num_train))
        return split(self, seed, num_train, num_test)

    monkeypatch.setattr(Task, "split", spy)
    job = AccuracyJob(
        "vanilla", {}, "mqar", {"seq_len": 24}, steps=1, batch_size=4,
        curriculum=(Stage({"seq_len": 12, "num_pairs": 2}, steps=2, batch_size=4),),
    )  # fmt: skip
    train_seed(registry, prepare(registry, job), seed=0)
    assert asked == [("mqar(seq_len=12, num_pairs=2)", 1024), ("mqar(seq_len=24)", 1024)]


@pytest.mark.parametrize(
    ("curriculum", "message"),
    [
        ("{ seq_len = 12 }", r"tasks\[0\]\.curriculum: must be a list of tables"),
        ("[{ steps = 2 }]", r"curriculum\[0\]: a stage needs at least one task option"),
        ("[{ seq_len = 12, steps = 0 }]", r"curriculum\[0\]\.steps: must be a positive"),
        ("[{ num_pairs = 40 }]", r"tasks\[0\]: curriculum stage 0: .*num_pairs must be between"),
        ("[{ vocab_size = 128 }]", r"stage 0 .* vocab_size 128 .* keep the options"),
        ("[{ seq_len = 12 }, { seq_len = 12 }]", r"trains mqar\(seq_len=12\) twice"),
        ("[{ seq_len = 64 }]", r"trains mqar twice"),
    ],
)
def test_curriculum_tables_are_validated(spec_file, curriculum, message):
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\n[[tasks]]\nname = "mqar"\n'
        f"curriculum = {curriculum}\n"
    )
    with pytest.raises(SpecError, match=message):
        load_spec(spec_file(body), Registry.discover(entry_points=False))


def test_a_stage_label_may_not_repeat_another_tasks_label(spec_file):
    stage = "curriculum = [{ seq_len = 32, num_pairs = 4 }]\n"
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\n'
        f'[[tasks]]\nname = "mqar"\n{stage}'
        f'[[tasks]]\nname = "mqar"\nseq_len = 128\nnum_pairs = 8\n{stage}'
    )
    with pytest.raises(SpecError, match=r"mqar\(seq_len=32\) curriculum. is listed more"):
        load_spec(spec_file(body), Registry.discover(entry_points=False))


def test_resume_of_a_directory_that_is_not_a_run_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_resume_refuses_options_it_would_ignore(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path), "--seq-lens", "64"]) == 2
    assert "drop --seq-lens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ("0,64", "must be positive"),
        ("64,64", "lists 64 more than once"),
        ("-3", "must be positive"),
    ],
)
def test_bad_seq_lens_are_refused(spec_file, tmp_path, lengths, message, capsys):
    """By the spec's own rule for seq_lens, once merged into it, naming the flag."""
    assert main(["run", spec_file(TINY), "--seq-lens", lengths, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"key 'seq_lens': {message}" in err and f"--seq-lens {lengths} merged" in err
    assert not (tmp_path / "tiny").exists()


def test_a_run_with_an_erroring_cell_exits_1(spec_file, tmp_path, write_plugin, capsys):
    plugin = write_plugin("flaky.py", FLAKY_PLUGIN)
    code = main(
        [
            "run",
            spec_file(TINY),
            "--variants",
            "flaky",
            "--seq-lens",
            "16",
            "--out",
            str(tmp_path),
            "--plugins-dir",
            str(plugin.parent),
        ]
    )
    assert code == 1 and "raised an error" in capsys.readouterr().err


def test_resume_finds_the_plugin_directories_the_run_started_with(
    spec_file, tmp_path, write_plugin, capsys
):
    plugin = write_plugin("flaky.py", FLAKY_PLUGIN)
    common = ["--variants", "vanilla,flaky", "--seq-lens", "8", "--out", str(tmp_path)]
    main(["run", spec_file(TINY), *common, "--plugins-dir", str(plugin.parent)])
    (run_dir,) = (tmp_path / "tiny").iterdir()
    rows = RunStore(run_dir).path("results.jsonl")
    rows.write_text("".join(rows.read_text().splitlines(keepends=True)[:2]))  # lose flaky's
    configure([])  # a new shell: no --plugins-dir given
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert {row["variant"] for row in RunStore(run_dir).rows()} == {"vanilla", "flaky"}

"""The decode pass in the report: its figures draw the rows' numbers (time per token with
the read limit dashed beside it, the state's bytes on log-log axes), apart from the whole
passes' figures; flags that doubt only the limit leave the points solid; the tables say
what a decode line's numbers are."""

from __future__ import annotations

import json
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from playground.report.plots import draw_figures, load_run, variant_colour
from playground.report.summary import summarize
from playground.report.tables import summary_entries, summary_title
from playground.run.instruments import FLAG_LARGE_SPREAD, FLAG_WEIGHTS_DOMINATE

CONTEXTS = (1024, 4096, 16384)
BANDWIDTH = 1e10
STATE_PER_TOKEN = {"vanilla": 4096.0, "gqa": 1024.0}
"""Bytes per token of context: gqa's cache a quarter of vanilla's (2 of 8 heads)."""
LINEAR_STATE = 131072.0


def decode_row(variant: str, n: int, **fields: Any) -> dict[str, Any]:
    state = LINEAR_STATE if variant == "linear" else STATE_PER_TOKEN[variant] * n
    time_ms = 0.5 if variant == "linear" else 2e-4 * n
    row = {
        "cell": f"{variant}|n={n}|decode",
        "variant": variant,
        "label": variant,
        "options": {},
        "seq_len": n,
        "batch_size": 1,
        "d_model": 512,
        "num_heads": 8,
        "device": "cpu",
        "dtype": "float32",
        "pass": "decode",
        "status": "ok",
        "error": None,
        "node": "test-node",
        "threads": 2,
        "time_ms": time_ms,
        "time_iqr_ms": time_ms / 20,
        "timed_runs": 5,
        "steps_per_run": 8,
        "decoded_past_context": 129,
        "state_bytes": state,
        "bandwidth_bytes_per_s": BANDWIDTH,
        "read_limit_ms": state / BANDWIDTH * 1e3,
        "bandwidth_efficiency": state / BANDWIDTH * 1e3 / time_ms,
        "flags": [],
    }
    row.update(fields)
    return row


def rows() -> list[dict[str, Any]]:
    made = [decode_row(v, n) for v in ("vanilla", "gqa") for n in CONTEXTS]
    made += [decode_row("linear", n, flags=[FLAG_WEIGHTS_DOMINATE]) for n in CONTEXTS[:2]]
    made.append(decode_row("linear", CONTEXTS[2], flags=[FLAG_LARGE_SPREAD]))
    made.append(
        {
            **decode_row("vanilla", 32768),
            "status": "oom",
            "error": "out of memory",
            "time_ms": None,
            "state_bytes": None,
        }
    )
    forward = {
        **decode_row("vanilla", 1024),
        "cell": "vanilla|n=1024|forward",
        "pass": "forward",
        "time_ms": 50.0,
        "peak_memory_bytes": 2**24,
    }
    for key in ("state_bytes", "read_limit_ms", "bandwidth_efficiency"):
        del forward[key]
    return [*made, forward]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Figure]:
    directory = tmp_path_factory.mktemp("decode_run")
    (directory / "spec.toml").write_text('name = "decode"\n')
    env = {"torch_version": "2.x", "device": "cpu", "device_name": "Test CPU"}
    env.update(threads=2, gemm_flops_per_s=1e11, memory_bandwidth_bytes_per_s=BANDWIDTH)
    (directory / "env.json").write_text(json.dumps(env))
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    return draw_figures(load_run(directory))


def solid_lines(figure: Figure) -> dict[str, Any]:
    """The legend's series lines of a one-panel figure, by variant."""
    (axes,) = figure.axes
    return {
        line.get_label().split("  ")[0]: line
        for line in axes.lines
        if not line.get_label().startswith("_")
    }


def test_the_decode_figures_are_their_own(drawn):
    assert {"decode_time_vs_n", "decode_state_vs_n", "time_vs_n"} <= set(drawn)
    (forward,) = drawn["time_vs_n"].axes  # the forward alone: no decode panel there
    assert forward.get_title() == "forward"
    assert drawn["decode_time_vs_n"].axes[0].get_xlabel() == "context length n (tokens)"


def test_latency_per_token_is_drawn_from_the_rows(drawn):
    lines = solid_lines(drawn["decode_time_vs_n"])
    for variant in ("vanilla", "gqa"):
        x, y = lines[variant].get_data()
        assert list(x) == list(CONTEXTS)
        assert list(y) == pytest.approx([2e-4 * n for n in CONTEXTS])
        assert to_hex(lines[variant].get_color()) == variant_colour(variant)
    assert "n^{1.00}" in lines["vanilla"].get_label()  # the time grows as n exactly


def test_the_read_limit_is_dashed_in_the_variants_colour(drawn):
    (axes,) = drawn["decode_time_vs_n"].axes
    dashed = [line for line in axes.lines if line.get_linestyle() == "--"]
    gqa = next(line for line in dashed if to_hex(line.get_color()) == variant_colour("gqa"))
    assert list(gqa.get_ydata()) == pytest.approx([1024 * n / BANDWIDTH * 1e3 for n in CONTEXTS])
    texts = [t.get_text() for t in drawn["decode_time_vs_n"].legends[0].get_texts()]
    assert any("memory bandwidth (10.0 GB/s)" in text for text in texts)


def test_the_state_is_drawn_log_log_from_the_rows(drawn):
    figure = drawn["decode_state_vs_n"]
    (axes,) = figure.axes
    assert axes.get_xscale() == "log" and axes.get_yscale() == "log"
    lines = solid_lines(figure)
    vanilla, gqa, linear = (lines[v].get_ydata() for v in ("vanilla", "gqa", "linear"))
    assert list(vanilla) == pytest.approx([4096 * n / 2**20 for n in CONTEXTS])
    assert [v / g for v, g in zip(vanilla, gqa, strict=True)] == pytest.approx([4.0] * 3)
    assert list(linear) == pytest.approx([LINEAR_STATE / 2**20] * 3)  # flat, as measured


def test_only_a_flag_on_the_time_itself_makes_a_point_hollow(drawn):
    (axes,) = drawn["decode_time_vs_n"].axes
    hollow = [line for line in axes.lines if line.get_markerfacecolor() == "white"]
    # linear's first two points carry only "weights > state" (about the limit): solid
    assert [tuple(line.get_xdata()) for line in hollow] == [(CONTEXTS[2],)]


def test_a_failed_decode_cell_is_marked_and_listed(drawn):
    footnote = drawn["decode_time_vs_n"].get_supxlabel()
    assert "oom: vanilla n=32768 decode: out of memory" in footnote


def test_the_tables_say_what_a_decode_line_holds():
    lines = summarize(rows())
    assert "time per generated token" in summary_title(lines)
    assert "time per generated token" not in summary_title(
        [x for x in lines if x.pass_name != "decode"]
    )
    line = next(x for x in lines if x.label == "gqa" and x.seq_len == 4096)
    entries = summary_entries(line)
    assert entries[:4] == ["gqa", "decode", "4096", "0.819"]
    assert entries[6] == "4" and entries[8] == f"{line.bandwidth_efficiency:.2f}"  # state MiB


def test_a_states_bytes_are_never_hollow(drawn):
    (axes,) = drawn["decode_state_vs_n"].axes
    assert not [line for line in axes.lines if line.get_markerfacecolor() == "white"]

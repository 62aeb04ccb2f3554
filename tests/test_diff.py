"""echosim diff: two steps term by term (saved reports or layouts written as flags), and why each term moved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.compiler import compile as compile_model
from echosim.explain.diff import compare
from echosim.plan import Cluster, Plan
from echosim.plugins import get_registry

SMALL = ["--backend", "h100-sxm", "--global-batch", "16", "--seq-len", "1024"]


def _invoke(*args: str) -> tuple[int, str]:
    get_registry().add_commands(cli)
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _save(tmp_path: Path, name: str, *flags: str) -> Path:
    path = tmp_path / name
    code, out = _invoke("compile", *flags, "--out", str(path), "--json")
    assert code == 0, out
    return path


def test_time_terms_add_up_and_each_moved_term_names_the_settings_behind_it() -> None:
    a = compile_model("gpt3-1.3b", Plan(tp=2, pp=4, dp=2, global_batch=16), Cluster("h100-sxm", 16)).to_dict()
    b = compile_model("gpt3-1.3b", Plan(tp=4, pp=2, dp=2, global_batch=16), Cluster("h100-sxm", 16)).to_dict()
    c = compare(a, b)
    time_terms = [t for t in c.terms if t.unit == "s" and t.name != "step_time_s"]
    assert sum(t.delta for t in time_terms) == pytest.approx(c.term("step_time_s").delta, rel=1e-4, abs=1e-6)
    assert ("tp", 2, 4) in c.changes and ("pp", 4, 2) in c.changes
    assert "tp 2 -> 4" in c.term("comm.tp").why and "pp 4 -> 2" in c.term("bubble").why
    assert c.term("memory.peak").a == max(m["peak"] for m in a["memory"])
    assert not c.notes
    assert "dp" not in " ".join(c.term("memory.optimizer").why)  # no ZeRO: dp shards nothing


def test_the_gradient_dtype_explains_both_the_gradient_buffer_and_its_reduction() -> None:
    """ZeRO 0-2 reduce gradients in the dtype they are kept in: a change of --grad-dtype, or of the framework that
    sets it (NeMo's 16-bit buffer against Megatron's fp32 one), moves memory.grads and comm.dp, and names itself."""
    plan, cluster = Plan(dp=8, zero=1, global_batch=16, framework="megatron"), Cluster("h100-sxm", 8)
    a = compile_model("gpt3-1.3b", plan, cluster).to_dict()
    for b_plan, said in (
        (replace(plan, grad_dtype="bf16"), "grad_dtype"),
        (replace(plan, framework="nemo"), "framework"),
    ):
        c = compare(a, compile_model("gpt3-1.3b", b_plan, cluster).to_dict())
        for name in ("memory.grads", "comm.dp"):
            term = c.term(name)
            assert term.b < term.a and any(w.startswith(said) for w in term.why), (name, said, term)


def test_a_framework_change_names_itself_behind_the_terms_it_moves() -> None:
    """DeepSeek-V3's framework against Megatron's on an fp8 MoE layout: FP8 exchanges (comm.ep), what backward keeps
    (memory.activations) and the kernels (compute.*) move, and each names the framework."""
    from echosim.frontend.zoo import ArchConfig

    moe = ArchConfig("moe", layers=2, hidden=256, heads=4, kv_heads=4, vocab=1024, ffn=512, seq_len=256, experts=4,
                     top_k=2, moe_ffn=256)  # fmt: skip
    plan = Plan(dp=8, ep=4, zero=1, global_batch=16, dtype="fp8", framework="megatron", moe_dispatcher="deepep")
    cluster = Cluster("h100-sxm", 8)
    a = compile_model(moe, plan, cluster).to_dict()
    c = compare(a, compile_model(moe, replace(plan, framework="hai-llm"), cluster).to_dict())
    moved = [t for t in c.terms if t.name in ("comm.ep", "memory.activations") or t.name.startswith("compute.")]
    moved = [t for t in moved if t.a != t.b]
    assert {t.name for t in moved} >= {"comm.ep", "memory.activations"}
    assert all(any(w.startswith("framework") for w in t.why) for t in moved), moved


def test_diff_of_two_saved_reports_and_of_two_flag_layouts_agree(tmp_path: Path) -> None:
    a = _save(tmp_path, "a.json", "gpt3-1.3b", "--tp", "2", "--pp", "4", "--dp", "2", *SMALL)
    b = _save(tmp_path, "b.json", "gpt3-1.3b", "--tp", "4", "--pp", "2", "--dp", "2", *SMALL)
    code, from_files = _invoke("diff", str(a), str(b), "--json")
    assert code == 0, from_files
    flags = " ".join(SMALL)
    code, from_flags = _invoke("diff", "gpt3-1.3b", "--a", f"--tp 2 --pp 4 --dp 2 {flags}",
                               "--b", f"--tp 4 --pp 2 --dp 2 {flags}", "--json")  # fmt: skip
    assert code == 0, from_flags
    files, flagged = json.loads(from_files), json.loads(from_flags)
    assert files["terms"] == flagged["terms"] and files["changes"] == flagged["changes"]
    code, text = _invoke("diff", str(a), str(b))
    assert (
        code == 0 and "comm.tp" in text and "tp 2 -> 4" in text and "memory of the stage with the largest peak" in text
    )


def test_reports_of_different_models_are_compared_and_it_says_so(tmp_path: Path) -> None:
    a = _save(tmp_path, "a.json", "gpt3-1.3b", "--dp", "2", *SMALL)
    b = _save(tmp_path, "b.json", "gpt3-2.7b", "--dp", "2", *SMALL)
    code, out = _invoke("diff", str(a), str(b))
    assert code == 0, out
    assert "note: the reports are of different models: gpt3-1.3b and gpt3-2.7b" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"traceEvents": []}', "not an echosim report (no step_time_s, breakdown, memory, plan, model"),
        ("not json at all", "not an echosim report (not JSON)"),
        ('{"step_time_s": "fast", "breakdown": {}, "memory": [], "plan": {}, "model": "x"}',
         "not an echosim report (step_time_s is not a positive number)"),
        ('{"step_time_s": 1.0, "breakdown": {}, "memory": [], "plan": {}, "model": "x"}',
         "not an echosim report (memory is not a list of stages)"),
    ],
)  # fmt: skip
def test_files_that_are_not_reports_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = _save(tmp_path, "good.json", "gpt3-125m", "--dp", "2")
    for args in ((str(bad), str(good)), (str(good), str(bad))):
        code, out = _invoke("diff", *args)
        assert code == 1 and "Traceback" not in out
        assert len(out.strip().splitlines()) == 1 and message in out and "bad.json" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["only-one.json"], "give two saved reports (A.json B.json), or MODEL --a FLAGS --b FLAGS"),
        (["/nonexistent/a.json", "/nonexistent/b.json"], "/nonexistent/a.json: cannot read"),
        (["gpt3-125m", "--a", "--tp 5"], "tp=5 does not divide"),
        (["gpt3-125m", "--a", "--tp two"], "--a '--tp two': Invalid value for '--tp'"),
        (["a.json", "b.json", "--a", "--tp 2"], "with --a/--b give at most one MODEL"),
    ],
)
def test_bad_diff_input_is_one_line(args: list[str], message: str) -> None:
    code, out = _invoke("diff", *args)
    assert code == 1 and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1 and message in out


def test_small_changes_of_time_read_in_milliseconds() -> None:
    """A DLRM step lasts 3 ms: its terms' moves would all read '+0.000 s'; under 0.1 s they are milliseconds."""
    from echosim.explain.diff import signed_s
    from echosim.explain.whatif import why

    assert [signed_s(x) for x in (-0.412, 0.1, -0.00076, 0.000691, 0.0)] == [
        "-0.412 s", "+0.100 s", "-0.76 ms", "+0.69 ms", "+0.00 ms",
    ]  # fmt: skip
    cluster = Cluster("h100-sxm", 16)
    a, b = (compile_model("dlrm-dcnv2", Plan(dp=16, micro_batch=2048, global_batch=32768, embedding_sharding=kind),
                          cluster).to_dict() for kind in ("auto", "table_row"))  # fmt: skip
    line = why(a, b)
    assert " ms; " in line and "0.000 s" not in line

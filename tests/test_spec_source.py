"""`bench --spec --spec-file`: the copy-edit workload from a file of the user's, on real files
(the standard library, this repo's own C probe and shell script, not written for these tests)."""

from __future__ import annotations

import colorsys
import inspect
import json.decoder
from pathlib import Path

import pytest

from velo_chat.engine.bench.spec import (
    TokenTimes,
    copy_edit_budget,
    format_spec_lines,
    shared_rates,
    workloads,
)
from velo_chat.engine.engine import PromptTooLong
from velo_chat.engine.bench.spec_source import (
    SpecSourceError,
    colorsys_source,
    copy_edit_source,
    new_name,
    pick_rename,
    uses,
)

from tests.support.engine_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]


def test_the_built_in_prompt_is_colorsys_attached_as_a_user_attaches_it() -> None:
    """The copy-edit prompt is what a user attaching the file sends (`render_user_content`);
    measurements dated before 2026-12-05 (docs/results/speculation.md) ran an older prompt
    that opened "Here is colorsys.py:" above the same fenced file."""
    source = inspect.getsource(colorsys)
    assert workloads()["copy-edit"][0].content == (
        "colorsys.py\n```python\n" + source + "```\n\nRename the function `_v` to "
        "`_value` everywhere (its definition and every call) and give back the whole file, "
        "nothing else."
    )
    assert workloads(colorsys_source()) == workloads()


def test_picks_the_name_a_person_would() -> None:
    # colorsys: `_v` is defined once and called three times; every public function appears
    # twice (its def and __all__), so the built-in workload's choice is the picker's too
    assert pick_rename(inspect.getsource(colorsys), ".py") == ("_v", "function")
    decoder = inspect.getsource(json.decoder)
    name, kind = pick_rename(decoder, ".py") or ("", "")
    assert (name, kind) == ("JSONDecodeError", "class")
    assert uses(decoder, name) >= 5
    # a C file: the names it #defines; a shell script's functions are `name() {`, not a keyword
    c_name = pick_rename((REPO / "packaging" / "amx_probe.c").read_text(), ".c")
    assert c_name is not None and c_name[0] in ("ARCH_REQ_XCOMP_PERM", "XFEATURE_XTILEDATA")


def _reply(ids: list[int], step_s: float) -> TokenTimes:
    return TokenTimes(ids, [i * step_s for i in range(len(ids))])


def test_replies_that_part_are_compared_over_what_they_share() -> None:
    """On a GPU speculation's reply may part from plain decoding's (batch rounding); bench then
    also rates both over the tokens they share, so the speedup compares the same text."""
    common = list(range(100, 180))
    off = [_reply([*common, 1, 2, 3], 0.002), _reply([*common, 1, 2, 3], 0.002)]
    on = [_reply([*common, 7, 7, 7, 7, 7, 7], 0.001), _reply([*common, 7, 8], 0.0008)]
    r = shared_rates(off, on)
    assert r["shared_tokens"] == 80
    assert r["tok_s_off_shared"] == pytest.approx(500.0)
    assert r["tok_s_on_shared"] == pytest.approx((1000.0 + 1250.0) / 2)
    assert r["speedup_shared"] == pytest.approx(2.25)
    assert shared_rates(off[:1], [_reply(off[0].ids, 0.001)]) == {}  # identical: nothing to add
    assert shared_rates(off, [_reply([*common[:20], 5] * 4, 0.001)]) == {}  # too little shared
    row = {"tok_s_off": 500.0, "tok_s_on": 1100.0, "speedup": 2.2, "identical": False, **r}
    section = {"max_draft": 16, "min_match": 3, "novel": row, "cost": {"1": 1.0}, "cost_1_ms": 1.0}
    lines = format_spec_lines({**section, "limit_full": 1.0, "limit_at_copy_acceptance": 1.0})
    said = "over those, 500.0 -> 1125.0 tok/s, 2.25x"
    assert f"  novel: the replies part after 80 tokens (batch rounding); {said}" in lines


def test_copy_edit_replies_the_whole_file_unless_told() -> None:
    """The reply a copy-edit prompt asks for is the file, about the prompt's length: that is its
    budget by default, as far as the context leaves room and at least the other rows'
    `--decode-tokens`; a `--decode-tokens` the user gives sets it."""
    assert copy_edit_budget("colorsys.py", 1926, 4096, 256, None) == 1926
    assert copy_edit_budget("colorsys.py", 1926, 3000, 256, None) == 3000 - 1926
    assert copy_edit_budget("colorsys.py", 100, 4096, 256, None) == 256
    assert copy_edit_budget("colorsys.py", 1926, 4096, 256, 16) == 16
    for n_ctx, copy_tokens in ((2048, None), (4096, 3000)):
        with pytest.raises(PromptTooLong, match=r"colorsys.py\) is 1,926 tokens .* the context holds"):
            copy_edit_budget("colorsys.py", 1926, n_ctx, 256, copy_tokens)


def test_never_a_dunder_and_never_a_name_used_once() -> None:
    text = "class A:\n    def __init__(self):\n        pass\n\n    def run(self):\n        pass\n"
    # `A` is one letter, `__init__` a dunder, `run` defined and never used again
    assert pick_rename(text, ".py") is None
    text += "\nA().run()\n"
    assert pick_rename(text, ".py") == ("run", "function")


def test_a_python_file_that_does_not_parse_falls_back_to_keywords() -> None:
    text = "def load(path:\n    return open(path)\n\nload('x')\n"  # a syntax error
    assert pick_rename(text, ".py") == ("load", "name")


def test_the_new_name_is_new() -> None:
    assert new_name("parse") == "new_parse" and new_name("Config") == "NewConfig"
    assert new_name("_v") == "_new_v" and new_name("__x") == "__new_x"
    text = "def parse():\n    pass\n\nnew_parse = parse\nparse()\n"
    source = copy_edit_source("p.py", text)
    assert source.old == "parse" and source.new == "new_new_parse" and uses(text, source.new) == 0


def test_the_prompt_names_the_file_and_the_rename() -> None:
    text = (REPO / "packaging" / "amx_probe.c").read_text()
    source = copy_edit_source("amx_probe.c", text, "XFEATURE_XTILEDATA=TILEDATA_FEATURE")
    message = source.message().content
    assert message.startswith("amx_probe.c\n```c\n/* Does this machine run AMX")
    assert "Rename the name `XFEATURE_XTILEDATA` to `TILEDATA_FEATURE` everywhere" in message
    assert source.describe() == {
        "file": "amx_probe.c",
        "lines": text.count("\n"),
        "rename": ["XFEATURE_XTILEDATA", "TILEDATA_FEATURE"],
    }


@pytest.mark.parametrize(
    "name, text, rename, fragment",
    [
        ("empty.py", " \n\n", None, "is empty"),
        ("README.md", "Just prose, nothing defined here.\n", None, "--spec-rename OLD=NEW"),
        ("a.py", "def f(): pass\nf()\n", "f", "takes OLD=NEW"),
        ("a.py", "def f(): pass\nf()\n", "f=f", "takes OLD=NEW"),
        ("a.py", "def f(): pass\nf()\n", "f=1x", "takes OLD=NEW"),
        ("a.py", "def f(): pass\nf()\n", "g=h", "'g' does not occur"),
        ("a.py", "def f(): pass\ng = f()\n", "f=g", "'g' already occurs"),
    ],
)
def test_what_cannot_make_a_workload_says_why(name, text, rename, fragment) -> None:
    with pytest.raises(SpecSourceError, match=fragment):
        copy_edit_source(name, text, rename)


def _user_error(proc, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and fragment in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_cli_refuses_bad_spec_files_in_one_line(velo_home, tmp_path: Path) -> None:
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"def f():\x00\n")
    huge = tmp_path / "huge.py"
    huge.write_text("x = 1\n" * 200_000)
    prose = tmp_path / "notes.txt"
    prose.write_text("Nothing is defined in here.\n")
    for args, fragment in (
        (("--spec-file", str(REPO / "packaging" / "amx_probe.c")), "goes with --spec"),
        (("--spec", "--spec-rename", "a=b"), "goes with --spec-file"),
        (("--spec", "--spec-file", str(tmp_path / "missing.py")), "No such file"),
        (("--spec", "--spec-file", str(tmp_path)), "Is a directory"),
        (("--spec", "--spec-file", str(binary)), "binary"),
        (("--spec", "--spec-file", str(huge)), "1,200,000 bytes"),
        (("--spec", "--spec-file", str(prose)), "--spec-rename OLD=NEW"),
    ):
        _user_error(run_cli("bench", *args), fragment)


def test_a_file_too_long_for_the_context_is_refused_after_load(velo_home) -> None:
    profiles = velo_home / "config" / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "small.toml").write_text("[context]\nn_ctx = 512\nn_batch = 64\nn_ubatch = 64\n")
    proc = run_cli(
        "bench",
        "--spec",
        "--profile",
        "small",
        "--decode-tokens",
        "16",
        "--spec-file",
        inspect.getsourcefile(json.decoder) or "",
    )
    _user_error(proc, "the context holds 512")
    assert "decoder.py" in proc.stderr


def test_bench_spec_measures_speculation_enabled_whatever_the_profile_says(velo_home) -> None:
    """The shipped default profile leaves speculation off and decodes on every core: `bench
    --spec` loads it with speculation on and the batch rounding accepted, so its "on" column
    speculates, says under which guarantee, and says whether the text came out identical.
    `--load 1`: the section runs beside a busy process, and says so."""
    import json

    proc = run_cli("bench", "--spec", "--json", "--decode-tokens", "12", "--repeats", "1", "--load", "1")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)["sections"]["speculation"]
    assert s["busy_processes"] == 1
    assert "beside 1 busy process" in "\n".join(format_spec_lines(s))
    assert s["speculation"].startswith("on:")
    assert s["copy_edit_source"]["file"] == "colorsys.py"
    for row in ("copy-edit", "novel", "replay"):
        assert isinstance(s[row]["identical"], bool) and s[row]["tok_s_on"] > 0
    # the "on" column ran the stepper: drafts were found (taken, or declined where a batch
    # of 2 threads does not pay; with speculation off there is no stepper and both are 0)
    assert s["replay"]["drafted"] + s["replay"]["declined"] > 0

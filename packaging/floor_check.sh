#!/usr/bin/env bash
# The oldest UI libraries pyproject.toml allows, tested: a throwaway venv (build/floor-venv) with
# textual and markdown-it-py at their floors (read from pyproject.toml; everything else as pip
# resolves it), llama_cpp linked from .venv (its version is pinned and its build is slow), and
# the TUI tests run against it. The snapshot tests are left out: they compare renderings of one
# Textual version.
#
#   bash packaging/floor_check.sh        (after `make bootstrap`; extra arguments go to pytest)
#
# Textual's floor is 5.0.1: Markdown.get_stream came in 5.0.0 and MarkdownStream is exported
# from textual.widgets.markdown since 5.0.1. markdown-it-py's is 2.2 (what current rich needs).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
venv=build/floor-venv
floors=$(.venv/bin/python - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for name in ("textual", "markdown-it-py"):
    spec = next(d for d in deps if re.match(rf"{re.escape(name)}\s*>=", d))
    print(f"{name}=={spec.split('>=', 1)[1].split(',')[0].strip()}")
PY
)
if [ ! -x "$venv/bin/python" ]; then
  .venv/bin/python -m venv "$venv"
fi
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install --quiet $floors numpy platformdirs jinja2 diskcache \
  pytest pytest-asyncio gguf
"$venv/bin/python" -m pip install --quiet $floors  # a later requirement may have moved them
# velo_chat as installed (pyproject's package-dir mapping) and llama_cpp from .venv, as links.
links=build/floor-links
mkdir -p "$links/velo_chat"
for d in app engine kernels store assets; do ln -sfn "$here/$d" "$links/velo_chat/$d"; done
site=$(.venv/bin/python -c 'import llama_cpp, os; print(os.path.dirname(os.path.dirname(llama_cpp.__file__)))')
ln -sfn "$site/llama_cpp" "$links/llama_cpp"
echo "floor-check: $("$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(textual|markdown-it-py|rich) ' | tr -s ' ' | paste -sd ',')"
tests=$(ls tests/test_tui_*.py | grep -v snapshots)
# shellcheck disable=SC2086
PYTHONPATH="$here/$links" "$venv/bin/python" -m pytest -q -p no:cacheprovider $tests "$@"

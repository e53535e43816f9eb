#!/usr/bin/env bash
# Prepare .device-suite/, what benchmarks/device/device_suite.sh needs to run the whole test
# suite on the GPU machine, which reaches no package registry and takes at most 64 MiB a call:
#   .device-suite/whl/*.whl      every package the tests import that the device image may lack
#                                (Textual and its Markdown stack, the OpenAI SDK and
#                                llama-cpp-python's server stack for the remote tests, the pytest
#                                plugins, gguf), for its Python (3.12), at this .venv's versions
#   .device-suite/test-data/     llama.cpp's chat templates (the test-data cache, not SmolLM2)
#   .device-suite/smol/part-NN   SmolLM2-135M Q4_1 (94 MB) in two parts, and its sha256: the
#                                first 39 MB, which fits the first call beside the rest, and
#                                what is left (59 MB), which fits a call of its own
#
#   bash benchmarks/device/prepare_suite.sh      # from the repo root, after `make test` once
#
# device_suite.sh's header lists what each of its two calls carries.
# .device-suite/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
dest=.device-suite
cache=${VELO_TEST_CACHE:-.cache/test-data}
smol=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$smol" ] || { echo "prepare_suite: no $smol (run the tests once first)" >&2; exit 1; }
# the closure of what the tests import, as installed in this .venv (numpy and llama-cpp-python
# excluded: the device has numpy, and device_build.sh builds llama-cpp-python there)
names=$("$py" - <<'PY'
import importlib.metadata as m
import re

from packaging.requirements import Requirement

roots = ["velo-chat[test]", "llama-cpp-python[server]", "pytest-textual-snapshot"]
seen: set[str] = set()
todo = [Requirement(r) for r in roots]
while todo:
    req = todo.pop()
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    try:
        dist = m.distribution(name)
    except m.PackageNotFoundError:
        continue
    if name not in ("numpy", "llama-cpp-python", "ruff", "mypy", "mypy-extensions", "pathspec", "librt"):
        seen.add(name)
    for raw in dist.requires or []:
        sub = Requirement(raw)
        extras = ["", *req.extras]
        if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
            key = re.sub(r"[-_.]+", "-", sub.name).lower()
            if key not in seen or sub.extras:
                todo.append(sub)
seen.discard("velo-chat")
print(" ".join(f"{n}=={m.version(n)}" for n in sorted(seen)))
PY
)
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/whl" "$dest.tmp/smol"
for pinned in $names; do
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --dest "$dest.tmp/whl" "$pinned"
done
cp -r "$cache/llama-cpp-python-0.3.36-templates" "$dest.tmp/test-data"
head -c 39000000 "$smol" > "$dest.tmp/smol/part-00"
tail -c +39000001 "$smol" > "$dest.tmp/smol/part-01"
(cd "$(dirname "$smol")" && sha256sum "$(basename "$smol")") > "$dest.tmp/smol/sha256"
ls "$dest.tmp/smol" | grep -c '^part-' > "$dest.tmp/smol/parts"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
du -sh "$dest"/* >&2
ls "$dest/smol" >&2

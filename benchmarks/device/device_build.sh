# Sourced by the device scripts: the llama-cpp-python CUDA build (sm_90) with packaging/patches
# applied and ggml's CPU code built for x86-64-v3 as packaging/bootstrap.sh builds it on x86_64,
# into $site (/tmp: a warm machine reuses it; the stamp holds the flags and the patches' hash),
# then the package mapping as links and PYTHONPATH. Run from the repo root with
# .device/ carried (benchmarks/device/prepare_device.sh makes it). Sets root, out, site.
root=$PWD; out=${OUT:-/tmp/out}; site=${VELO_SITE:-/tmp/velo-site-ple}
mkdir -p "$out" "$site" /tmp/res
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
stamp="$flags $(cat packaging/patches/*.patch | sha256sum | cut -c1-16)"
if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .device/whl/*.whl
  rm -rf /tmp/src-ple && mkdir -p /tmp/src-ple && tar xJf .device/llcpp.tar.xz -C /tmp/src-ple
  for p in "$root"/packaging/patches/*.patch; do
    if command -v patch > /dev/null; then patch -p1 --batch --forward --silent -d /tmp/src-ple/llama_cpp_python-0.3.36 < "$p" || exit 1
    else (cd /tmp/src-ple/llama_cpp_python-0.3.36 && git apply -p1 "$p") || exit 1; fi
  done
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-index \
    --no-deps --no-build-isolation --upgrade --target "$site" /tmp/src-ple/llama_cpp_python-0.3.36 \
    > "$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
  echo "$stamp" > "$site/.stamp"
fi
mkdir -p /tmp/pkg/velo_chat
for d in app engine kernels store assets; do ln -sfn "$root/$d" "/tmp/pkg/velo_chat/$d"; done
export PYTHONPATH=/tmp/pkg:$site:$root

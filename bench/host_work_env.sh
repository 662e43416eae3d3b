#!/usr/bin/env bash
# The published notebooks' host work redone with the software they ran: CPython 3.8 (each notebook's
# metadata, `language_info.version`, says 3.8.10), torch 1.10.0 (PopTorch 2.6 and 3.0, of Poplar SDK 2.6
# and 3.0, are built against it), the transformers each notebook prints, and datasets, pyarrow and numpy
# releases of the months before each notebook's date. Interpreted Python is most of that work and this
# project's Python 3.11 runs it faster, while today's datasets fetches a row more slowly: the figures move
# both ways, and `bench/calibration.py` reads these, not the ones of today's software.
#
#   [PYTHON38=path/to/python3.8] bash bench/host_work_env.sh [ENV_DIR] [--rounds 9]    # needs the package index
#
# ENV_DIR (default /tmp/optimum-ipu-notebooks-2022) keeps the environment between runs; the calibration's
# figures are medians of 9 rounds. Other arguments go to `bench/host_work.py`.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENV_DIR=/tmp/optimum-ipu-notebooks-2022
if [[ $# -gt 0 && $1 != -* ]]; then ENV_DIR=$1; shift; fi
PYTHON38="${PYTHON38:-python3.8}"  # or the path of a CPython 3.8, e.g. PYTHON38=~/.pyenv/versions/3.8.18/bin/python
IS_38='import sys; assert sys.version_info[:2] == (3, 8)'
"$PYTHON38" -c "$IS_38" 2>/dev/null \
    || { echo "needs CPython 3.8: set PYTHON38 to its path (e.g. pyenv install 3.8)" >&2; exit 1; }
[ -x "$ENV_DIR/bin/python" ] || "$PYTHON38" -m venv "$ENV_DIR"
# Never install the 2022 pins into another environment (this project's, given as ENV_DIR by mistake).
"$ENV_DIR/bin/python" -c "$IS_38" 2>/dev/null \
    || { echo "$ENV_DIR is not a Python 3.8 environment: give a new folder" >&2; exit 1; }
PIP=("$ENV_DIR/bin/pip" install -q --disable-pip-version-check)

# The NER notebook (token_classification.ipynb, 2022-08-10): transformers 4.20.0; the data set and metric
# libraries released before that date (datasets 2.4.0 of 2022-07-25, pyarrow 8.0.0, numpy 1.23.1).
# Their dependencies pinned to releases of mid-2022 as well (and so that pip need not search).
"${PIP[@]}" torch==1.10.0 numpy==1.23.1 pyarrow==8.0.0 datasets==2.4.0 transformers==4.20.0 \
    seqeval==1.2.2 scikit-learn==1.1.1 scipy==1.8.1 pandas==1.4.3 xxhash==3.0.0 dill==0.3.5.1 \
    multiprocess==0.70.13 fsspec==2022.7.1 aiohttp==3.8.1 huggingface-hub==0.8.1 tokenizers==0.12.1 \
    requests==2.28.1 tqdm==4.64.0 responses==0.18.0 packaging==21.3 pyyaml==6.0 filelock==3.7.1 \
    regex==2022.7.25 typing-extensions==4.3.0
OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 "$ENV_DIR/bin/python" "$HERE/host_work.py" --only ner "$@"

# The packed BERT notebook (packed_bert_text_classification.ipynb, 2022-12-19): transformers 4.20.1;
# datasets 2.7.1 (2022-11-22), pyarrow 10.0.1, numpy 1.23.5.
"${PIP[@]}" numpy==1.23.5 pyarrow==10.0.1 datasets==2.7.1 transformers==4.20.1 fsspec==2022.11.0 \
    huggingface-hub==0.11.1
OMP_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 "$ENV_DIR/bin/python" "$HERE/host_work.py" --only packed "$@"

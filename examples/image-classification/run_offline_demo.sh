#!/usr/bin/env bash
# Offline end-to-end demo of run_image_classification.py on ChestX-ray14-shaped data: generate
# grayscale X-rays and Data_Entry_2017_v2020.csv, build a tiny ViT from a config (no weights can be
# downloaded here), train it multi-label on the simulated IPU with Graphcore/vit-base-ipu's layout,
# and print the macro ROC AUC over the 14 findings before and after training. The generated findings
# are faint and overlapping, with the real data set's prevalences and 10% label noise, so the trained
# model ends well short of perfect (add GENERATOR_FLAGS=--easy for the easy data). Plots land in
# $WORK/output/*.png.
#
#   bash examples/image-classification/run_offline_demo.sh [extra run_image_classification.py flags]
#
# Environment: PYTHON (default python), WORK (default ./chestxray_offline_demo), PATIENTS (default 1000),
# GENERATOR_FLAGS (extra make_synthetic_chestxray.py flags, e.g. --easy).
#
# Real ChestX-ray14 (https://nihcc.app.box.com/v/ChestXray-NIHCC): put the extracted PNGs in
# DIR/images/ beside DIR/Data_Entry_2017_v2020.csv (and, if you have them, train_val_list.txt and
# test_list.txt), then run the walkthrough's setting:
#   python examples/image-classification/run_image_classification.py --chestxray_dir DIR \
#     --model_name_or_path google/vit-base-patch16-224-in21k --ipu_config_name Graphcore/vit-base-ipu \
#     --do_train --do_eval --num_train_epochs 3 --learning_rate 2e-4 --warmup_ratio 0.25 \
#     --lr_scheduler_type cosine --per_device_train_batch_size 1 --per_device_eval_batch_size 1 \
#     --seed 1337 --logging_steps 50 --save_steps 1000 --output_dir chestxray_vit
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python}"
WORK="${WORK:-$PWD/chestxray_offline_demo}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"

"$PYTHON" "$HERE/make_synthetic_chestxray.py" --output_dir "$WORK/data" --patients "${PATIENTS:-1000}" --image_size 128 \
  ${GENERATOR_FLAGS:-}

# A 4-layer ViT on 64 px images; Graphcore/vit-base-ipu places 12 layers as [3,3,3,3], so the tiny
# model gets one layer per IPU. GA 8 (vit-base-ipu's 128 is sized for 100k images) x micro-batch 4
# = 32 images per step; 20% of the images (by patient) are held out for validation.
"$PYTHON" "$HERE/run_image_classification.py" \
  --chestxray_dir "$WORK/data" \
  --train_val_split 0.2 \
  --model_type vit \
  --model_config_overrides "image_size=64,patch_size=16,hidden_size=64,num_hidden_layers=4,num_attention_heads=4,intermediate_size=128" \
  --ipu_config_name Graphcore/vit-base-ipu \
  --ipu_config_overrides "layers_per_ipu=[1 1 1 1]" \
  --gradient_accumulation_steps 8 \
  --per_device_train_batch_size 4 \
  --per_device_eval_batch_size 8 \
  --do_train \
  --do_eval \
  --evaluate_before_training \
  --num_train_epochs 8 \
  --learning_rate 1e-3 \
  --weight_decay 0.01 \
  --warmup_ratio 0.1 \
  --lr_scheduler_type cosine \
  --loss_scaling 64 \
  --seed 1337 \
  --logging_steps 10 \
  --save_strategy no \
  --dataloader_num_workers 0 \
  --output_dir "$WORK/output" \
  --overwrite_output_dir \
  "$@"

"$PYTHON" - "$WORK/output/all_results.json" <<'PY'
import json
import sys

results = json.load(open(sys.argv[1]))
print(f"\nSynthetic ChestX-ray14 validation set (split by patient), macro ROC AUC over "
      f"{int(results['eval_roc_auc_findings_scored'])} findings:")
if "untrained_roc_auc" in results:
    print(f"  untrained (random init):  {results['untrained_roc_auc']:.4f}")
print(f"  trained, {results.get('train_steps', '?')} steps:  {results['eval_roc_auc']:.4f}   "
      f"({results.get('train_runtime', float('nan')):.0f} s of training)")
PY

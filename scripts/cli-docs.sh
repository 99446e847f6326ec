#!/usr/bin/env bash
# Writes docs/guide/cli.md from the dpcomp binary's own help, so that the page cannot drift from
# the flags clap parses: `bash scripts/cli-docs.sh [path/to/dpcomp] > docs/guide/cli.md`.
# tests/project/cli_docs.rs fails when a command or flag in `dpcomp ... --help` is missing from the page
# (or the page names one the binary does not have); rerun this script when it does.
set -euo pipefail
bin="${1:-target/release/dpcomp}"

# One sentence per command, in the order they are written; subcommands follow their parent.
commands=(
    ""
    train audit eval export
    data "data fetch"
    grid pack plot epsilon convex fl
    analyze "analyze gradient-error" "analyze clipping" "analyze fl-sparsity"
    bench "bench train" "bench dp" "bench finetune" "bench compress" "bench comm" "bench fl-reconstruction"
    check-device check-comm
)
declare -A intro=(
    [top]="The program: one binary with a subcommand per task. \`dpcomp help <command>\` or \`dpcomp <command> --help\` prints what is below."
    [train]="Trains one of the four built-in tasks (Surnames, CIFAR-10, CIFAR-100, SNLI), with or without DP-SGD and with any compressor, into a run folder; \`--resume\` continues it. Under \`mpiexec -n W\` each rank is one data-parallel worker. See [privacy.md](privacy.md), [compression.md](compression.md) and [distributed.md](distributed.md)."
    [audit]="Trains once as \`train\` would, with canaries, and reports an empirical lower bound on ε beside the accounted ε. It takes every \`train\` flag plus the audit's own. See [auditing.md](auditing.md)."
    [eval]="Reports the test accuracy of a run's checkpoint (the checkpoint's checksums are verified first)."
    [export]="Writes a finished SNLI run's fine-tuned BERT or RoBERTa as a Hugging Face folder (\`config.json\`, \`model.safetensors\` with LoRA adapters merged, and the tokenizer files) that \`from_pretrained\` reads, or with \`--adapter\` its LoRA adapter as a PEFT folder on the pre-trained model."
    [data]="Dataset management; its one subcommand downloads the official archives. See [install.md](install.md#data)."
    ["data fetch"]="Downloads one dataset's official archive into the data folder, checks its SHA-256 and unpacks it."
    [grid]="Runs every cell of an experiment file (training, \`kind = \"convex\"\`, \`kind = \"fl\"\` or \`kind = \"audit\"\`), skipping finished cells and resuming interrupted ones, packs the logs of the finished cells, then writes the results tables. See [experiments.md](experiments.md)."
    [pack]="Packs the logs of finished runs (\`metrics.jsonl.gz\`, \`grad_error.jsonl.gz\`), which every command reads as the plain logs. See [experiments.md](experiments.md#packed-logs)."
    [plot]="Draws the figures (PNG and SVG) of a grid's runs from their logs, or of a clipping sweep."
    [epsilon]="The accountant on its own: ε for a sampling rate, noise multiplier, step count and δ, or the σ that reaches a target ε. See [privacy.md](privacy.md#accountants)."
    [convex]="DP-SGD for convex (possibly non-smooth) losses on tabular data: output perturbation, gradient perturbation, or the non-private baseline. See [convex.md](convex.md)."
    [fl]="Simulates federated learning in one process (FL-STD, FL-RND, FL-FREQ, FL-CS, or a deep-learning compressor), with or without client-level DP. See [federated.md](federated.md)."
    [analyze]="Diagnostics that read training data outside the accountant: gradient error, clipping-radius sweeps, sparsity of federated updates."
    ["analyze gradient-error"]="Measures the gradient error (clipping, noise, compression; bias² and variance) at the checkpoint of finished runs and appends it to their \`grad_error.jsonl\`."
    ["analyze clipping"]="Sweeps the clipping radius C and compares the measured error with the clipping model and its minimiser; takes a task with \`train\` settings or a finished run."
    ["analyze fl-sparsity"]="Measures how much of a federated client update's energy the largest coordinates and the DCT coefficients hold, for the federated models."
    [bench]="Benchmarks: step times, memory, compressor overhead, communication and reconstruction cost. See [gpu.md](gpu.md) and [../results/benchmarks.md](../results/benchmarks.md)."
    ["bench train"]="Times the non-private training step of a task."
    ["bench dp"]="Times the non-private and the DP step of a task side by side, with peak memory (and peak CUDA memory on a GPU) and host reads per step."
    ["bench finetune"]="Times the non-private and the DP step of a pre-trained transformer fine-tuned in one mode (MiniLM, or GPT-2 small's shape as a language model), with peak memory and the trainable-parameter count."
    ["bench compress"]="Times a compressor's encode and decode against the backward pass on real gradients, and the message's trip to bytes and back."
    ["bench comm"]="Times W MPI ranks' steps per compressor (compute, encode, communication, decode, bytes) and models the speed-up over a range of links and worker counts. Run it under \`mpiexec\`."
    ["bench fl-reconstruction"]="Times FL-CS's OWL-QN reconstruction at a given model size and ratio."
    [check-device]="Correctness on one device, the GPU kit's first step: per-sample gradients of the four models against per-example autograd, and every compressor against its CPU result. See [gpu.md](gpu.md)."
    [check-comm]="Checks every collective the data-parallel workers use, on every rank. See [distributed.md](distributed.md)."
)

cat <<'HEAD'
# The `dpcomp` command line

Every command and subcommand, with the help text the binary prints for it (`dpcomp <command>
--help`). This page is generated from that help by `scripts/cli-docs.sh`, and
`tests/project/cli_docs.rs` fails when a flag is added to or removed from the binary without the page
following, so the flags below are exactly the binary's.

Flags of `train` can also be written in a TOML file given with `--config`: by their names
(`noise_multiplier = 1`) or in the sections of a run's `config.toml` (`[privacy]
noise_multiplier = 1`). Flags given on the command line override the file; an unknown key is
an error naming the file and the key.

HEAD

echo "Commands:"
echo
for c in "${commands[@]}"; do
    [ -z "$c" ] && continue
    anchor="dpcomp-${c// /-}"
    echo "- [\`dpcomp $c\`](#$anchor)"
done
echo

for c in "${commands[@]}"; do
    words=($c)
    case ${#words[@]} in
        0) level="##" ;;
        1) level="##" ;;
        *) level="###" ;;
    esac
    title="dpcomp${c:+ $c}"
    echo "$level $title"
    echo
    echo "${intro[${c:-top}]}" | fold -s -w 96 | sed 's/ *$//'
    echo
    echo '```text'
    # shellcheck disable=SC2086 # the subcommand is several words
    "$bin" $c --help | sed 's/[[:space:]]*$//'
    echo '```'
    echo
done | sed '$d'

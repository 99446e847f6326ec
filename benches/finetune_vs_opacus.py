"""Private fine-tuning step: dpcomp against Opacus 1.6 on the same transformers model, batch and mode.

Both sides fine-tune the same architecture on a batch of the same shape (sequences of --seq-len
tokens, no padding), one DP-SGD step at a time (per-sample clipping at C = 1, Gaussian noise):

- minilm: all-MiniLM-L6-v2 (`models/all-MiniLM-L6-v2`, BertForSequenceClassification with 3
  labels), dpcomp's SNLI classifier;
- gpt2-small: GPT-2 small's shape (GPT2LMHeadModel, random weights), the causal LM loss.

Modes: `lora` (PEFT's LoraConfig, r 8, alpha 16, PEFT's default targets: query/value, c_attn;
the classifier trains as modules_to_save) and `full` (every weight). Opacus runs its ghost
clipping (`grad_sample_mode="ghost"`) where its layers allow it; GPT-2's Conv1D has no Opacus
grad sampler, so GPT-2 runs LoRA only (its trainable layers are nn.Linear). dpcomp runs
`dpcomp bench finetune --json` (its DP step on a fixed batch). Rounds alternate between the two;
printed: each side's median step time and Opacus / dpcomp (above 1: dpcomp is faster).

    .venv/bin/python benches/finetune_vs_opacus.py --model minilm --mode lora --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def build(model_name, mode, bert_dir):
    from transformers import BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if model_name == "minilm":
        model = BertForSequenceClassification.from_pretrained(bert_dir, num_labels=3, attn_implementation="eager")
        targets = ["query", "value"]
    else:
        model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager"))
        targets = ["c_attn"]
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        task = "SEQ_CLS" if model_name == "minilm" else "CAUSAL_LM"
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets,
                                                 task_type=task))
    # from_pretrained returns the model in eval mode; Opacus validates training mode.
    return model.train()


class LmLoss(nn.Module):
    """Each sequence's mean next-token cross-entropy, summed over the batch as Opacus expects a
    loss reduced over examples (its ghost clipping rescales it)."""

    def forward(self, logits, ids):
        per_token = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                ids[:, 1:].reshape(-1), reduction="none")
        return per_token.view(ids.size(0), -1).mean(1).mean()


def opacus_step_seconds(model_name, mode, batch, seq_len, sigma, steps, warmup, bert_dir):
    from opacus import PrivacyEngine

    model = build(model_name, mode, bert_dir)
    vocab = model.config.vocab_size
    torch.manual_seed(1)
    ids = torch.randint(1000, vocab, (batch, seq_len))
    labels = torch.randint(0, 3, (batch,))
    lm = model_name == "gpt2-small"
    targets = ids if lm else labels
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, targets), batch_size=batch)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    criterion = LmLoss() if lm else nn.CrossEntropyLoss()
    engine = PrivacyEngine(accountant="rdp")
    grad_sample_mode = "ghost"
    made = engine.make_private(module=model, optimizer=optimizer, data_loader=loader, criterion=criterion,
                               noise_multiplier=sigma, max_grad_norm=1.0, poisson_sampling=False,
                               grad_sample_mode=grad_sample_mode)
    model, optimizer, criterion = made[0], made[1], made[2]
    model.train()

    # BERT's default token types and positions are buffers shared by the batch (expanded, or
    # [1, T]), which Opacus's embedding norm sampler cannot take per example; the same values
    # given [B, T] are the same input.
    positions = torch.arange(seq_len).expand(batch, seq_len).contiguous()
    extra = {} if lm else {"token_type_ids": torch.zeros_like(ids), "position_ids": positions}

    def step():
        out = model(input_ids=ids, **extra).logits
        loss = criterion(out, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    trainable = sum(p.numel() for p in params)
    return (time.perf_counter() - start) / steps, grad_sample_mode, trainable


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["minilm", "gpt2-small"], default="minilm")
    ap.add_argument("--mode", choices=["lora", "full"], default="lora")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--noise-multiplier", type=float, default=0.8)
    ap.add_argument("--dpcomp", default="target/release/dpcomp")
    ap.add_argument("--bert-dir", default="models/all-MiniLM-L6-v2")
    args = ap.parse_args()
    if args.model == "gpt2-small" and args.mode == "full":
        sys.exit("Opacus has no per-sample gradients for GPT-2's Conv1D: gpt2-small runs --mode lora only")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = []
    for r in range(args.rounds):
        cmd = [args.dpcomp, "bench", "finetune", "--model", args.model, "--fine-tuning", args.mode,
               "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--steps", str(args.steps),
               "--rounds", "1", "--warmup", str(args.warmup), "--noise-multiplier", str(args.noise_multiplier),
               "--bert-dir", args.bert_dir, "--device", "cpu", "--json"]
        ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        theirs, mode, trainable = opacus_step_seconds(args.model, args.mode, args.batch_size, args.seq_len,
                                                      args.noise_multiplier, args.steps, args.warmup, args.bert_dir)
        rows.append((ours["dp_mean_step_seconds"], theirs))
        print(f"round {r + 1}: dpcomp DP {ours['dp_mean_step_seconds'] * 1e3:.1f} ms "
              f"({ours['trainable_parameters']} trainable), Opacus ({mode}) {theirs * 1e3:.1f} ms "
              f"({trainable} trainable), Opacus / dpcomp {theirs / ours['dp_mean_step_seconds']:.2f}",
              file=sys.stderr)
    import opacus
    print(json.dumps({
        "model": args.model, "mode": args.mode, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "opacus_version": opacus.__version__, "opacus_mode": mode, "threads": torch.get_num_threads(),
        "dpcomp_dp_step_seconds": statistics.median(o for o, _ in rows),
        "opacus_dp_step_seconds": statistics.median(t for _, t in rows),
        "speedup_opacus_over_dpcomp": statistics.median(t / o for o, t in rows),
    }))


if __name__ == "__main__":
    main()

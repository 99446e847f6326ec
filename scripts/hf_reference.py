"""Hugging Face reference models and logits for dpcomp's fine-tuning tests.

transformers and peft (installed into .venv by scripts/setup.sh) are the oracle against which
dpcomp's Hugging Face loader, its fine-tuning and its exports are checked. Nothing is downloaded:
every model is built from a config with random weights, and the script runs with
HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1.

Subcommands (run with .venv/bin/python):

  make --out DIR
      Writes tiny random float32 checkpoints, each a `save_pretrained` folder (config.json and
      model.safetensors) in DIR/<name>/:
        bert           BertForSequenceClassification, 3 labels
        roberta        RobertaForSequenceClassification, 3 labels (pad_token_id 1)
        gpt2           GPT2LMHeadModel, lm_head tied to transformer.wte
        gpt2-cls       GPT2ForSequenceClassification, 3 labels, pad_token_id set
        llama          LlamaForCausalLM, 4 query heads sharing 2 key/value heads, untied lm_head
        llama-sharded  the llama weights saved in several shards with model.safetensors.index.json
      Each folder also holds reference.safetensors with the inputs below and `logits`, the
      model's output in eval mode: [B, num_labels] for the classifiers, [B, T, vocab] for the
      language models. The weights are drawn with torch.manual_seed, so two runs write the same
      tensors.

  check --model DIR --reference FILE [--adapter ADAPTER_DIR]
      Loads DIR with AutoModelForSequenceClassification or AutoModelForCausalLM (chosen from
      config.json's `architectures`), applies the PEFT adapter in ADAPTER_DIR if given
      (PeftModel.from_pretrained), runs FILE's inputs in eval mode and prints one JSON line
      {"max_abs_diff": x, "shape": [...]} comparing the logits with FILE's `logits`; exit status 0.
      Exit status 1, with the reason on stderr, when loading fails, when a weight of DIR or of the
      adapter is missing or left unused, or when the logits' shapes differ.

  lora-example --base DIR --out DIR2
      DIR is a folder written by `make`. Writes three PEFT LoRA adapters with `save_pretrained`
      (adapter_config.json and adapter_model.safetensors) and the adapted model's reference:
        DIR2/gpt2-lora   on DIR/gpt2,  target_modules ["c_attn"], task_type CAUSAL_LM
        DIR2/llama-lora  on DIR/llama, target_modules ["q_proj", "v_proj"], task_type CAUSAL_LM
        DIR2/bert-lora   on DIR/bert,  target_modules ["query", "value"], task_type SEQ_CLS: the
                         adapter also holds the trained classifier head
      with r=4, lora_alpha=8 (scale alpha/r = 2), lora_dropout 0. lora_B and the head are random
      (peft starts lora_B at zero), so that the adapter changes the logits. Check one with
        check --model DIR/gpt2 --adapter DIR2/gpt2-lora
              --reference DIR2/gpt2-lora/reference.safetensors

Inputs in reference.safetensors (B=3 rows, T=7 positions, all int64):
  input_ids       [3, 7]  right padding: the rows hold 7, 5 and 2 tokens, then padding. Tokens are
                          drawn from 3..=98, so no token equals a special id; padded positions hold
                          the config's pad_token_id (0 where the config has none, as for llama).
  attention_mask  [3, 7]  1 on a token, 0 on padding. A masked position is never attended to as a
                          key; its own row is still computed (it attends to the row's tokens, and
                          causally only to those before it in the decoders), so the language
                          models' logits at padded positions are defined too.
  token_type_ids  [3, 7]  bert only: 0 on the first (n + 1) // 2 tokens of a row of n tokens, 1 on
                          the rest, 0 on padding.
No position ids are stored: the models compute the defaults themselves.
  bert, gpt2, llama: position p of every row has position id p (0, 1, ..., T-1), padding or not.
  roberta: position ids come from input_ids: a non-pad token's id is padding_idx + its count of
           non-pad tokens up to and including it (2, 3, ... for padding_idx = pad_token_id = 1);
           a pad token gets padding_idx. The position table has max_position_embeddings rows.
Pooling of the classifiers:
  bert: the tanh pooler on position 0, then the classifier. roberta: position 0 through the head's
  dense + tanh + out_proj. gpt2-cls: the score row at the rightmost position whose input_id is not
  pad_token_id (from input_ids, not from attention_mask).
The models run with attn_implementation="eager" (softmax of the scaled scores plus the mask, which
adds the dtype's lowest value at masked keys).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

VOCAB = 100
BATCH = 3
SEQ_LEN = 7
ROW_LENGTHS = (7, 5, 2)
FIRST_TOKEN = 3
LAST_TOKEN = 98
NUM_LABELS = 3
ATTN = "eager"


def small(hidden):
    """The sizes every tiny model shares."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
    )


def bert_config():
    from transformers import BertConfig

    return BertConfig(
        **small(32),
        hidden_act="gelu",
        type_vocab_size=2,
        pad_token_id=0,
        num_labels=NUM_LABELS,
        architectures=["BertForSequenceClassification"],
    )


def roberta_config():
    from transformers import RobertaConfig

    # Position ids reach padding_idx + T, so the position table needs T + 2 rows for T tokens
    # (roberta-base: 514 rows for 512 tokens); 64 rows are plenty for the reference's 7.
    return RobertaConfig(
        **small(48),
        hidden_act="gelu",
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=NUM_LABELS,
        architectures=["RobertaForSequenceClassification"],
    )


def gpt2_config(architecture, **labels):
    from transformers import GPT2Config

    # GPT-2 has no padding token of its own; fine-tuning sets pad = eos, here the last id (99).
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=64,
        initializer_range=0.2,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
        architectures=[architecture],
        **labels,
    )


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )


# Each model's seed: its weights are drawn from torch.manual_seed(seed), its reference inputs from
# a generator seeded with 100 + seed.
SEEDS = {"bert": 1, "roberta": 2, "gpt2": 3, "gpt2-cls": 4, "llama": 5}


def build(name):
    """The random model `name`, in eval mode."""
    import transformers

    configs = {
        "bert": (bert_config, "BertForSequenceClassification"),
        "roberta": (roberta_config, "RobertaForSequenceClassification"),
        "gpt2": (lambda: gpt2_config("GPT2LMHeadModel"), "GPT2LMHeadModel"),
        "gpt2-cls": (
            lambda: gpt2_config("GPT2ForSequenceClassification", num_labels=NUM_LABELS),
            "GPT2ForSequenceClassification",
        ),
        "llama": (llama_config, "LlamaForCausalLM"),
    }
    make_config, class_name = configs[name]
    config = make_config()
    config._attn_implementation = ATTN
    torch.manual_seed(SEEDS[name])
    model = getattr(transformers, class_name)(config).to(torch.float32)
    # Norm weights start at 1 and biases at 0; random values make a loader that skips one of
    # them give other logits.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def pad_id(config):
    return config.pad_token_id if config.pad_token_id is not None else 0


def inputs_for(config, with_token_types, seed):
    """The right-padded batch described in the module docstring."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_TOKEN, LAST_TOKEN + 1, (BATCH, SEQ_LEN), generator=generator)
    mask = torch.zeros(BATCH, SEQ_LEN, dtype=torch.int64)
    types = torch.zeros(BATCH, SEQ_LEN, dtype=torch.int64)
    for row, length in enumerate(ROW_LENGTHS):
        mask[row, :length] = 1
        ids[row, length:] = pad_id(config)
        types[row, (length + 1) // 2 : length] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if with_token_types:
        batch["token_type_ids"] = types
    return batch


def logits_of(model, batch):
    with torch.no_grad():
        return model(**batch).logits.to(torch.float32).contiguous()


def write_reference(path, batch, logits):
    tensors = {name: value.contiguous() for name, value in batch.items()}
    tensors["logits"] = logits
    save_file(tensors, path)


def make(out):
    os.makedirs(out, exist_ok=True)
    for name in SEEDS:
        model = build(name)
        folder = os.path.join(out, name)
        model.save_pretrained(folder, safe_serialization=True)
        batch = inputs_for(model.config, name == "bert", seed=100 + SEEDS[name])
        logits = logits_of(model, batch)
        write_reference(os.path.join(folder, "reference.safetensors"), batch, logits)
        if name == "llama":
            sharded = os.path.join(out, "llama-sharded")
            model.save_pretrained(sharded, safe_serialization=True, max_shard_size="50KB")
            write_reference(os.path.join(sharded, "reference.safetensors"), batch, logits)
    print(f"wrote {out}/{{bert,roberta,gpt2,gpt2-cls,llama,llama-sharded}}")


def fail(message):
    print(f"hf_reference.py check: {message}", file=sys.stderr)
    sys.exit(1)


def load_checked(model_dir):
    """The model in model_dir, failing when one of its weights is missing or left unused."""
    import transformers

    config_path = os.path.join(model_dir, "config.json")
    try:
        with open(config_path) as f:
            architectures = json.load(f).get("architectures") or []
    except (OSError, ValueError) as error:
        fail(f"cannot read {config_path}: {error}")
    if not architectures:
        fail(f"{config_path} has no `architectures` list naming the model class")
    architecture = architectures[0]
    if architecture.endswith("ForSequenceClassification"):
        auto = transformers.AutoModelForSequenceClassification
    elif architecture.endswith("ForCausalLM") or architecture.endswith("LMHeadModel"):
        auto = transformers.AutoModelForCausalLM
    else:
        fail(
            f"{config_path}: architecture {architecture!r} is neither a "
            "...ForSequenceClassification nor a ...ForCausalLM/...LMHeadModel"
        )
    try:
        model, info = auto.from_pretrained(
            model_dir,
            dtype=torch.float32,
            attn_implementation=ATTN,
            output_loading_info=True,
        )
    except Exception as error:  # transformers raises many kinds; all mean "cannot load"
        fail(f"transformers cannot load {model_dir} as {architecture}: {error!r}")
    problems = {
        kind: sorted(info.get(kind) or [])
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        fail(f"{model_dir} does not match {architecture}: {problems}")
    return model


def check(model_dir, reference, adapter):
    model = load_checked(model_dir)
    if adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, adapter, strict_adapter_check="error")
        except Exception as error:
            fail(f"peft cannot apply the adapter {adapter} to {model_dir}: {error!r}")
    model.eval()
    try:
        tensors = load_file(reference)
    except Exception as error:
        fail(f"cannot read {reference}: {error!r}")
    for name in ("input_ids", "attention_mask", "logits"):
        if name not in tensors:
            fail(f"{reference} has no tensor `{name}`")
    batch = {
        name: tensors[name].to(torch.int64)
        for name in ("input_ids", "attention_mask", "token_type_ids")
        if name in tensors
    }
    try:
        logits = logits_of(model, batch)
    except Exception as error:
        fail(f"the forward pass of {model_dir} on {reference}'s inputs failed: {error!r}")
    expected = tensors["logits"].to(torch.float32)
    if logits.shape != expected.shape:
        fail(
            f"logits have shape {list(logits.shape)}, {reference}'s `logits` {list(expected.shape)}"
        )
    diff = (logits - expected).abs().max().item() if logits.numel() else 0.0
    print(json.dumps({"max_abs_diff": diff, "shape": list(logits.shape)}))


def lora_example(base, out):
    from peft import LoraConfig, get_peft_model

    # (model, adapter folder, target modules, task type, seed). For SEQ_CLS, peft also trains and
    # saves the classifier head (its `modules_to_save`: "classifier" or "score").
    examples = [
        ("gpt2", "gpt2-lora", ["c_attn"], "CAUSAL_LM", 6),
        ("llama", "llama-lora", ["q_proj", "v_proj"], "CAUSAL_LM", 7),
        ("bert", "bert-lora", ["query", "value"], "SEQ_CLS", 8),
    ]
    for model_name, adapter_name, targets, task_type, seed in examples:
        model_dir = os.path.join(base, model_name)
        model = load_checked(model_dir)
        config = LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=targets,
            # GPT-2's Conv1D stores its weight as [in, out]; peft needs to know to merge it.
            fan_in_fan_out=model_name == "gpt2",
            bias="none",
            task_type=task_type,
        )
        peft_model = get_peft_model(model, config)
        # Random lora_A, lora_B (peft starts lora_B at zero) and head, so that each changes the
        # logits.
        torch.manual_seed(seed)
        with torch.no_grad():
            for param in peft_model.parameters():
                if param.requires_grad:
                    param.copy_(0.3 * torch.randn_like(param))
        peft_model.eval()
        folder = os.path.join(out, adapter_name)
        peft_model.save_pretrained(folder, safe_serialization=True)
        reference = load_file(os.path.join(model_dir, "reference.safetensors"))
        batch = {name: value for name, value in reference.items() if name != "logits"}
        write_reference(
            os.path.join(folder, "reference.safetensors"), batch, logits_of(peft_model, batch)
        )
    print(f"wrote {out}/{{gpt2-lora,llama-lora,bert-lora}}")


def main():
    parser = argparse.ArgumentParser(
        description="Tiny random Hugging Face models and logits, "
        "the oracle of dpcomp's fine-tuning tests.",
        epilog="See the module docstring (scripts/hf_reference.py) for the input conventions.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make_parser = commands.add_parser("make", help="write the tiny checkpoints and their logits")
    make_parser.add_argument(
        "--out", required=True, help="folder that gets one subfolder per model"
    )
    check_parser = commands.add_parser(
        "check", help="load a folder (and adapter) in transformers/peft and compare its logits"
    )
    check_parser.add_argument("--model", required=True, help="a save_pretrained folder")
    check_parser.add_argument(
        "--reference", required=True, help="safetensors file with the inputs and `logits`"
    )
    check_parser.add_argument("--adapter", help="a PEFT adapter folder applied to --model")
    lora_parser = commands.add_parser(
        "lora-example", help="write PEFT LoRA adapters on the tiny gpt2, llama and bert"
    )
    lora_parser.add_argument("--base", required=True, help="a folder written by `make`")
    lora_parser.add_argument(
        "--out", required=True, help="folder that gets gpt2-lora/, llama-lora/ and bert-lora/"
    )
    args = parser.parse_args()
    if args.command == "make":
        make(args.out)
    elif args.command == "check":
        check(args.model, args.reference, args.adapter)
    else:
        lora_example(args.base, args.out)


if __name__ == "__main__":
    main()

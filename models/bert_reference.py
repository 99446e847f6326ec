"""Reference hidden states for tests/bert_reference.rs, produced once with Hugging Face
`transformers` (BertModel + BertTokenizerFast) from the same all-MiniLM-L6-v2 files that
scripts/setup.sh unpacks into models/all-MiniLM-L6-v2. The library is not a dependency of the
project; to regenerate:

    .venv/bin/pip install --target /tmp/hf transformers
    PYTHONPATH=/tmp/hf .venv/bin/python models/bert_reference.py > tests/fixtures/bert_reference.json
"""
import json
import sys

import torch
from transformers import BertModel, BertTokenizerFast

MODEL_DIR = "models/all-MiniLM-L6-v2"
PAIRS = [
    ("A man inspects the uniform of a figure in some East Asian country.", "The man is sleeping."),
    ("Two women are embracing while holding to go packages.", "Two woman are holding packages."),
]

def main():
    tokenizer = BertTokenizerFast.from_pretrained(MODEL_DIR)
    model = BertModel.from_pretrained(MODEL_DIR, attn_implementation="eager").eval()
    enc = tokenizer([p[0] for p in PAIRS], [p[1] for p in PAIRS], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    hidden = out.last_hidden_state  # [2, T, 384]
    mask = enc["attention_mask"]
    result = {
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "model": MODEL_DIR,
        "pairs": PAIRS,
        "input_ids": enc["input_ids"].tolist(),
        "token_type_ids": enc["token_type_ids"].tolist(),
        "attention_mask": mask.tolist(),
        # Hidden states of real (unpadded) tokens only: first 16 features of every token.
        "last_hidden_state_first16": [
            hidden[i, : int(mask[i].sum()), :16].tolist() for i in range(len(PAIRS))
        ],
        # Mean over real tokens of all 384 features, per pair.
        "last_hidden_state_mean": [
            hidden[i, : int(mask[i].sum())].mean(0).tolist() for i in range(len(PAIRS))
        ],
        "pooler_output_first16": out.pooler_output[:, :16].tolist(),
    }
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")

if __name__ == "__main__":
    main()

//! Pre-trained transformers from Hugging Face model folders, fine-tuned privately.
//!
//! A folder that `save_pretrained` wrote (`config.json`, `model.safetensors` or its shards) is
//! read into a model built from dpcomp's recorded layers, so that every weight that trains has
//! per-sample gradients: the BERT family (BERT, RoBERTa), GPT-2 and the Llama family. What
//! trains is a [`FineTuning`] mode: everything, the last k blocks, the biases (BiTFiT, Ben Zaken
//! et al. 2022) or LoRA adapters (Hu et al. 2021) on the projections a [`LoraConfig`] names.
//! The result goes out again as a Hugging Face folder (adapters merged) and, for LoRA, as a
//! PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`).

//!
//! The models: [`crate::models::BertClassifier`] (BERT and RoBERTa sequence classifiers),
//! [`Gpt2`] and [`Llama`] (a [`Head`]: causal language model or sequence classifier). A
//! language model's example is one sequence: its loss is the mean cross-entropy of its next
//! tokens ([`next_token_losses`]), whose gradient DP-SGD clips per sequence.

pub mod checkpoint;
pub mod export;
pub mod finetune;
pub mod gpt2;
pub mod llama;

pub use checkpoint::{write_safetensors, Checkpoint};
pub use export::{save_adapter, save_pretrained};
pub use finetune::FineTuning;
pub use gpt2::{Gpt2, Gpt2Config};
pub use llama::{Llama, LlamaConfig};

use crate::error::{Error, Result};
use crate::models::Model;
use crate::nn::{LoraConfig, LoraLinear};
use serde::{Deserialize, Serialize};
use std::path::Path;
use tch::Tensor;

/// The architectures dpcomp reads, by `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// `bert`: post-norm encoder, learned positions, token types.
    Bert,
    /// `roberta`: BERT's encoder with positions offset past the padding id.
    Roberta,
    /// `gpt2`: pre-norm decoder, Conv1D projections stored `[in, out]`, tied `lm_head`.
    Gpt2,
    /// `llama`: RMSNorm, rotary positions, SwiGLU, grouped-query attention.
    Llama,
}

impl Architecture {
    /// The architecture `dir/config.json` declares (`model_type`); another one is an error
    /// naming it and the file.
    pub fn of_folder(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        #[derive(Deserialize)]
        struct ModelType {
            model_type: Option<String>,
        }
        let declared: ModelType = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&path, format!("not a Hugging Face config.json: {e}")))?;
        match declared.model_type.as_deref() {
            Some("bert") => Ok(Architecture::Bert),
            Some("roberta") => Ok(Architecture::Roberta),
            Some("gpt2") => Ok(Architecture::Gpt2),
            Some("llama") => Ok(Architecture::Llama),
            Some(other) => Err(Error::bad_file(
                &path,
                format!("model_type {other:?}: expected one of \"bert\", \"roberta\", \"gpt2\", \"llama\""),
            )),
            None => Err(Error::bad_file(
                &path,
                "no model_type: expected one of \"bert\", \"roberta\", \"gpt2\", \"llama\"",
            )),
        }
    }

    /// The projections LoRA adapts when `LoraConfig::target_modules` is empty: PEFT's defaults
    /// for the architecture (the attention's query and value).
    pub fn default_lora_targets(self) -> &'static [&'static str] {
        match self {
            Architecture::Bert | Architecture::Roberta => &["query", "value"],
            Architecture::Gpt2 => &["c_attn"],
            Architecture::Llama => &["q_proj", "v_proj"],
        }
    }

    /// PEFT's `fan_in_fan_out` for the architecture: GPT-2's Conv1D stores its weight `[in, out]`.
    pub fn fan_in_fan_out(self) -> bool {
        self == Architecture::Gpt2
    }
}

/// What sits on top of the transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Head {
    /// Logits [B, classes] from the pooled sequence (BERT: the pooler on the first token;
    /// RoBERTa: its classification head on `<s>`; GPT-2 and Llama: `score` on the last real
    /// token), `*ForSequenceClassification`.
    SequenceClassification {
        /// The number of classes.
        classes: i64,
    },
    /// Next-token logits [B, T, vocabulary], `*ForCausalLM` / `GPT2LMHeadModel`.
    CausalLm,
}

/// A pre-trained transformer read from a Hugging Face folder: a [`Model`] that can say where its
/// blocks, heads and projections are (for the fine-tuning modes) and give its weights back under
/// Hugging Face's names.
pub trait Pretrained: Model {
    /// Which architecture it is.
    fn architecture(&self) -> Architecture;

    /// The name prefixes of its transformer blocks in order (`encoder.layer.0.`, ...).
    fn block_prefixes(&self) -> Vec<String>;

    /// The name prefixes that train in every mode but full fine-tuning's (a freshly initialised
    /// classification head); empty for a language model, whose head is pre-trained.
    fn head_prefixes(&self) -> Vec<String>;

    /// The name prefixes after the last block that train with it in `FineTuning::LastLayers`
    /// (GPT-2's `ln_f`, Llama's final norm, BERT's pooler).
    fn final_prefixes(&self) -> Vec<String>;

    /// Every projection that can carry a LoRA adapter, with its adapter where it has one.
    fn projections(&self) -> Vec<&LoraLinear>;

    /// The name `transformers` gives one of this model's weights (`encoder.layer.0...` ->
    /// `bert.encoder.layer.0...`); the same name where the model keeps Hugging Face's names.
    fn hf_name(&self, name: &str) -> String {
        name.to_string()
    }

    /// The weights under the names `transformers` reads, adapters merged (`LoraLinear::merged_weight`),
    /// in its layouts (GPT-2's Conv1D weights `[in, out]`); tied weights once.
    fn hf_tensors(&self) -> Vec<(String, Tensor)>;

    /// The `config.json` to write beside them: the one read, with what the head adds
    /// (`num_labels`, `architectures`).
    fn hf_config(&self) -> serde_json::Value;
}

/// The LoRA settings with the architecture's default targets filled in when none are named.
pub fn lora_for(architecture: Architecture, lora: &LoraConfig) -> LoraConfig {
    let mut lora = lora.clone();
    if lora.target_modules.is_empty() {
        lora.target_modules = architecture
            .default_lora_targets()
            .iter()
            .map(|t| t.to_string())
            .collect();
    }
    lora
}

/// Whether a weight's name is a LoRA adapter's (`....lora_A.weight`, `....lora_B.weight`).
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

/// Every weight of `model` but its adapters, each projection's with its adapter merged in
/// (`LoraLinear::merged_weight`), renamed and reshaped by `export` (name, tensor) -> (Hugging
/// Face's name, tensor), sorted by name: what `Pretrained::hf_tensors` returns for a model whose
/// layouts are Hugging Face's.
pub fn merged_state(
    model: &dyn Pretrained,
    export: impl Fn(&str, Tensor) -> (String, Tensor),
) -> Vec<(String, Tensor)> {
    let merged: std::collections::HashMap<String, Tensor> = model
        .projections()
        .into_iter()
        .map(|p| (format!("{}.weight", p.name), p.merged_weight()))
        .collect();
    let mut tensors: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(name, _)| !is_adapter(name))
        .map(|(name, var)| {
            let value = match merged.get(&name) {
                Some(weight) => weight.shallow_clone(),
                None => var.detach().copy(),
            };
            export(&name, value)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// `config` with what a `*ForSequenceClassification` checkpoint of `classes` classes says of
/// itself: its class in `architectures` and the labels `transformers` counts the classes from
/// (`id2label`, `label2id`: `LABEL_0`, ...).
pub fn classifier_config(
    config: &serde_json::Value,
    class: &str,
    classes: i64,
) -> serde_json::Value {
    let mut config = config.clone();
    if let Some(fields) = config.as_object_mut() {
        fields.insert("architectures".into(), serde_json::json!([class]));
        let id2label: serde_json::Map<String, serde_json::Value> = (0..classes)
            .map(|i| (i.to_string(), serde_json::json!(format!("LABEL_{i}"))))
            .collect();
        let label2id: serde_json::Map<String, serde_json::Value> = (0..classes)
            .map(|i| (format!("LABEL_{i}"), serde_json::json!(i)))
            .collect();
        fields.insert("id2label".into(), id2label.into());
        fields.insert("label2id".into(), label2id.into());
    }
    config
}

/// Each sequence's causal language-modelling loss, \[B\]: the mean cross-entropy of its next
/// tokens, position t's logits against token t + 1, over the positions before its last real
/// token (`lengths`; right padding is masked). One example is one sequence, so DP-SGD clips
/// each sequence's gradient. A sequence of one token has no next token: its loss is 0.
/// `logits` [B, T, V], `ids` [B, T] and `lengths` \[B\] on one device.
pub fn next_token_losses(logits: &Tensor, ids: &Tensor, lengths: &Tensor) -> Tensor {
    let (tokens, mask) = next_token_targets(logits, ids, lengths);
    let size = logits.size();
    let (b, t, v) = (size[0], size[1], size[2]);
    let predicted = logits.narrow(1, 0, t - 1).reshape([b * (t - 1), v]);
    let each = predicted
        .cross_entropy_loss::<Tensor>(&tokens.reshape([-1]), None, tch::Reduction::None, -100, 0.0)
        .view([b, t - 1])
        * &mask;
    let counts = mask.sum_dim_intlist(1, false, mask.kind()).clamp_min(1.0);
    each.sum_dim_intlist(1, false, each.kind()) / counts
}

/// Σ over the batch of each sequence's share of next tokens whose arg-max logit is right (the
/// accuracy `Model::correct` reports for a language model), a float64 scalar.
pub fn next_token_accuracy_sum(logits: &Tensor, ids: &Tensor, lengths: &Tensor) -> Tensor {
    let (tokens, mask) = next_token_targets(logits, ids, lengths);
    let t = logits.size()[1];
    let hits = logits
        .narrow(1, 0, t - 1)
        .argmax(-1, false)
        .eq_tensor(&tokens)
        .to_kind(tch::Kind::Double)
        * mask.to_kind(tch::Kind::Double);
    let counts = mask
        .to_kind(tch::Kind::Double)
        .sum_dim_intlist(1, false, tch::Kind::Double)
        .clamp_min(1.0);
    (hits.sum_dim_intlist(1, false, tch::Kind::Double) / counts).sum(tch::Kind::Double)
}

/// The next tokens [B, T - 1] and the mask of positions that have one (t + 1 < length), in the
/// logits' kind.
fn next_token_targets(logits: &Tensor, ids: &Tensor, lengths: &Tensor) -> (Tensor, Tensor) {
    let t = ids.size()[1];
    let tokens = ids.narrow(1, 1, t - 1).to_kind(tch::Kind::Int64);
    let positions = Tensor::arange(t - 1, (tch::Kind::Int64, ids.device())).unsqueeze(0);
    let mask = positions
        .lt_tensor(&(lengths.to_kind(tch::Kind::Int64).unsqueeze(1) - 1))
        .to_kind(logits.kind());
    (tokens, mask)
}

/// `Model::example_losses` of a Hugging Face model: each sequence's `next_token_losses` for a
/// language model (`language_model`) reading token sequences, the cross-entropy against the
/// labels otherwise.
pub(crate) fn head_example_losses(
    language_model: bool,
    output: &Tensor,
    features: &crate::data::Features,
    labels: &Tensor,
) -> Tensor {
    match (language_model, features) {
        (true, crate::data::Features::Tokens { ids, lengths }) => {
            next_token_losses(output, ids, &lengths.to_device(ids.device()))
        }
        _ => output.cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::None, -100, 0.0),
    }
}

/// `Model::mean_loss` of a Hugging Face model: the mean of `head_example_losses` for a
/// language model, the mean cross-entropy otherwise.
pub(crate) fn head_mean_loss(
    language_model: bool,
    output: &Tensor,
    features: &crate::data::Features,
    labels: &Tensor,
) -> Tensor {
    if language_model {
        head_example_losses(true, output, features, labels).mean(output.kind())
    } else {
        output.cross_entropy_loss::<Tensor>(labels, None, tch::Reduction::Mean, -100, 0.0)
    }
}

/// `Model::correct` of a Hugging Face model: each sequence's share of next tokens predicted
/// right for a language model (`next_token_accuracy_sum`), arg-max hits otherwise.
pub(crate) fn head_correct(
    language_model: bool,
    output: &Tensor,
    features: &crate::data::Features,
    labels: &Tensor,
) -> Tensor {
    match (language_model, features) {
        (true, crate::data::Features::Tokens { ids, lengths }) => {
            next_token_accuracy_sum(output, ids, &lengths.to_device(ids.device()))
        }
        _ => output
            .argmax(-1, false)
            .eq_tensor(labels)
            .sum(tch::Kind::Int64)
            .to_kind(tch::Kind::Double),
    }
}

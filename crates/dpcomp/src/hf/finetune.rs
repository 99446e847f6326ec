//! What a fine-tuning trains: every weight, the last k blocks, the biases (BiTFiT, Ben Zaken
//! et al. 2022) or LoRA adapters (Hu et al. 2021). The model is built with its adapters
//! (`FineTuning::lora`), then [`FineTuning::apply`] freezes what does not train; frozen weights
//! get no gradient and no per-sample work, and blocks with nothing trainable run without
//! autograd.

use super::Pretrained;
use crate::error::{Error, Result};
use crate::nn::LoraConfig;
use serde::{Deserialize, Serialize};

/// A fine-tuning mode (Hugging Face and PEFT's vocabulary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FineTuning {
    /// Every weight trains (embeddings included).
    #[default]
    Full,
    /// The last `layers` transformer blocks, what follows them (the final norm, BERT's pooler)
    /// and the classification head.
    LastLayers {
        /// How many blocks, counted from the last; at least 1 and at most the model's.
        layers: usize,
    },
    /// The biases of every layer and the classification head (BiTFiT).
    #[serde(rename = "bitfit")]
    BitFit,
    /// LoRA adapters on the projections the settings name, and the classification head.
    Lora(LoraConfig),
}

impl FineTuning {
    /// The LoRA settings the model is built with, in LoRA mode.
    pub fn lora(&self) -> Option<&LoraConfig> {
        match self {
            FineTuning::Lora(lora) => Some(lora),
            _ => None,
        }
    }

    /// A short name for tables and logs: `full`, `last-2`, `bitfit`, `lora-r8`.
    pub fn label(&self) -> String {
        match self {
            FineTuning::Full => "full".into(),
            FineTuning::LastLayers { layers } => format!("last-{layers}"),
            FineTuning::BitFit => "bitfit".into(),
            FineTuning::Lora(lora) => format!("lora-r{}", lora.rank),
        }
    }

    /// Freezes every weight of `model` this mode does not train (and makes trainable those it
    /// does). An error when the mode trains nothing of this model: more layers than it has,
    /// BiTFiT on a model without biases, LoRA targets that name no projection.
    pub fn apply(&self, model: &dyn Pretrained) -> Result<()> {
        let blocks = model.block_prefixes();
        let heads = model.head_prefixes();
        let starts = |name: &str, prefixes: &[String]| prefixes.iter().any(|p| name.starts_with(p));
        let trained_blocks: Vec<String> = match self {
            FineTuning::LastLayers { layers } => {
                if *layers < 1 || *layers > blocks.len() {
                    return Err(Error::bad_value(
                        "fine_tuning.layers",
                        format!(
                            "{layers}, expected 1 to {} (the model's blocks)",
                            blocks.len()
                        ),
                    ));
                }
                let mut trained = blocks[blocks.len() - layers..].to_vec();
                trained.extend(model.final_prefixes());
                trained
            }
            _ => Vec::new(),
        };
        let is_adapter = |name: &str| name.contains(".lora_A.") || name.contains(".lora_B.");
        let mut trainable_weights = 0usize;
        for (name, mut var) in model.var_store().variables() {
            let head = starts(&name, &heads);
            let trains = match self {
                FineTuning::Full => true,
                FineTuning::LastLayers { .. } => head || starts(&name, &trained_blocks),
                FineTuning::BitFit => head || name.ends_with(".bias"),
                FineTuning::Lora(_) => head || is_adapter(&name),
            };
            if trains && !head {
                trainable_weights += 1;
            }
            let _ = var.requires_grad_(trains);
        }
        if trainable_weights == 0 {
            let why = match self {
                FineTuning::BitFit => {
                    "BiTFiT trains biases and this model's layers have none".to_string()
                }
                FineTuning::Lora(lora) => {
                    let names: Vec<String> =
                        model.projections().iter().map(|p| p.name.clone()).collect();
                    format!(
                        "lora.target_modules {:?} name none of the model's projections ({})",
                        lora.target_modules,
                        names.join(", ")
                    )
                }
                _ => "the mode trains none of the model's weights".to_string(),
            };
            return Err(Error::bad_value("fine_tuning", why));
        }
        Ok(())
    }
}

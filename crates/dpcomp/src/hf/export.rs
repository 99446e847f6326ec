//! A fine-tuned model out again: as a Hugging Face folder that `from_pretrained` reads
//! (`config.json`, `model.safetensors`; LoRA adapters merged into their weights), and its LoRA
//! adapter as a PEFT folder (`adapter_config.json`, `adapter_model.safetensors`) that
//! `PeftModel.from_pretrained(base, folder)` puts on the pre-trained model. Both go to a new or
//! empty folder: a folder holding anything else is refused, so that no file dpcomp did not
//! write is replaced.

use super::{write_safetensors, Pretrained};
use crate::error::{Error, Result};
use std::path::Path;
use tch::Tensor;

/// Writes `model` as a Hugging Face folder in `dir` (created if missing; it must be empty):
/// `config.json` (`Pretrained::hf_config`) and `model.safetensors` (`Pretrained::hf_tensors`,
/// float32, adapters merged).
pub fn save_pretrained(model: &dyn Pretrained, dir: &Path) -> Result<()> {
    fresh_folder(dir)?;
    let config = serde_json::to_string_pretty(&model.hf_config())
        .map_err(|e| Error::bad_value("config.json", e.to_string()))?;
    write_safetensors(
        &dir.join(super::checkpoint::WEIGHTS_FILE),
        &model.hf_tensors(),
    )?;
    crate::run_folder::replace(&dir.join("config.json"), config.as_bytes())
}

/// Writes `model`'s LoRA adapters in PEFT's format in `dir` (created if missing; it must be
/// empty): `adapter_model.safetensors` with `base_model.model.<module>.lora_A.weight` [r, in]
/// and `lora_B.weight` [out, r] for every adapted projection and, for a classifier, its head
/// (PEFT's `modules_to_save`), and `adapter_config.json` naming the adapted modules in full.
/// `base_model` is recorded as `base_model_name_or_path` (the folder the model was read from).
/// An error when the model carries no adapter.
pub fn save_adapter(model: &dyn Pretrained, dir: &Path, base_model: Option<&str>) -> Result<()> {
    let adapted: Vec<_> = model
        .projections()
        .into_iter()
        .filter_map(|p| p.adapter.as_ref().map(|a| (p, a)))
        .collect();
    let Some((_, first)) = adapted.first() else {
        return Err(Error::bad_value(
            "fine_tuning",
            "the model carries no LoRA adapter: a PEFT adapter is written for LoRA fine-tuning only",
        ));
    };
    let rank = first.a.weight.size()[0];
    let (scaling, dropout) = (first.scaling, first.dropout);
    fresh_folder(dir)?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut targets = Vec::new();
    for (projection, adapter) in &adapted {
        let module = model.hf_name(&projection.name);
        tensors.push((
            format!("base_model.model.{module}.lora_A.weight"),
            adapter.a.weight.detach().copy(),
        ));
        tensors.push((
            format!("base_model.model.{module}.lora_B.weight"),
            adapter.b.weight.detach().copy(),
        ));
        targets.push(module);
    }
    let heads = model.head_prefixes();
    let mut modules_to_save = Vec::new();
    for (name, var) in model.var_store().variables() {
        if let Some(head) = heads.iter().find(|h| name.starts_with(h.as_str())) {
            tensors.push((
                format!("base_model.model.{}", model.hf_name(&name)),
                var.detach().copy(),
            ));
            let module = head.trim_end_matches('.').to_string();
            if !modules_to_save.contains(&module) {
                modules_to_save.push(module);
            }
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    targets.sort();
    let task_type = if heads.is_empty() {
        "CAUSAL_LM"
    } else {
        "SEQ_CLS"
    };
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": scaling * rank as f64,
        "lora_dropout": dropout,
        "target_modules": targets,
        "fan_in_fan_out": model.architecture().fan_in_fan_out(),
        "bias": "none",
        "modules_to_save": if modules_to_save.is_empty() { serde_json::Value::Null } else { modules_to_save.into() },
        "init_lora_weights": true,
        "inference_mode": true,
        "use_rslora": false,
        "use_dora": false,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| Error::bad_value("adapter_config.json", e.to_string()))?;
    write_safetensors(&dir.join("adapter_model.safetensors"), &tensors)?;
    crate::run_folder::replace(&dir.join("adapter_config.json"), text.as_bytes())
}

/// Creates `dir` or checks that it is an empty folder.
fn fresh_folder(dir: &Path) -> Result<()> {
    if dir.exists() {
        let not_empty = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .next()
            .is_some();
        if !dir.is_dir() || not_empty {
            return Err(Error::bad_value(
                "export folder",
                format!(
                    "{} is {}: expected a new or empty folder (nothing is replaced)",
                    dir.display(),
                    if dir.is_dir() { "not empty" } else { "a file" }
                ),
            ));
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
}

//! The BERT family as a sequence classifier: a Hugging Face BERT (Devlin et al. 2019) or RoBERTa
//! (Liu et al. 2019) encoder loaded from `config.json` + `model.safetensors` (or its shards),
//! and its classification head: BERT's pooler and a linear classifier (SNLI's model, as the
//! paper fine-tunes bert-base-cased), or RoBERTa's dense + `out_proj` head on `<s>`. What trains is
//! a [`FineTuning`] mode; the paper's is the last encoder layer, the pooler and the classifier
//! (`FineTuning::LastLayers { layers: 1 }`). Blocks with nothing trainable before the first
//! that trains run without autograd, so they cost no gradient work.
//!
//! Parameter names are Hugging Face's without the model's prefix (`embeddings.word_embeddings.weight`,
//! `encoder.layer.5.attention.self.query.weight`, ...). Checkpoints with the `bert.` or
//! `roberta.` prefix (`*ForSequenceClassification`, bert-base-cased) and without it (a bare
//! `BertModel` such as all-MiniLM-L6-v2) both load; TF-era `gamma`/`beta` names are read as
//! `weight`/`bias`; the masked-LM head (`cls.*`, `lm_head.*`) is ignored. A classifier in the
//! checkpoint with the requested number of classes is loaded, otherwise it starts fresh.

use super::{check_integer, check_range, wrong_features, Model};
use crate::data::Features;
use crate::error::{Error, Result};
use crate::hf::{Architecture, Checkpoint, FineTuning, Pretrained};
use crate::nn::{
    AttentionConfig, Ctx, Embedding, LayerNorm, Linear, LinearConfig, LoraConfig, LoraLinear,
    MultiheadAttention,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// The fields of Hugging Face's `config.json` that the architecture needs.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    /// `"bert"` (the default) or `"roberta"`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// The padding token's id: RoBERTa's positions count from it (default: none; RoBERTa 1).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Dropout before the classifier (default: `hidden_dropout_prob`).
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    /// Rows of the word-piece embedding table.
    pub vocab_size: i64,
    /// Width of every hidden state (bert-base: 768, MiniLM-L6: 384).
    pub hidden_size: i64,
    /// Number of encoder layers.
    pub num_hidden_layers: i64,
    /// Attention heads per layer; must divide `hidden_size`.
    pub num_attention_heads: i64,
    /// Width of each layer's feed-forward inner layer.
    pub intermediate_size: i64,
    /// The feed-forward activation; only `"gelu"` (the default) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Rows of the position table: the longest sequence the encoder reads.
    pub max_position_embeddings: i64,
    /// Rows of the token-type (segment) table (default 2).
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: i64,
    /// The LayerNorms' variance offset (default 1e-12).
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Dropout on embeddings and sublayer outputs in training, in [0, 1) (default 0.1).
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention probabilities in training, in [0, 1) (default 0.1).
    #[serde(default = "default_dropout")]
    pub attention_probs_dropout_prob: f64,
    /// Standard deviation of the classifier head's N(0, σ²) initialisation (default 0.02).
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
}

fn default_model_type() -> String {
    "bert".into()
}
fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> i64 {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_dropout() -> f64 {
    0.1
}
fn default_init_range() -> f64 {
    0.02
}

impl BertConfig {
    /// What an encoder of this configuration (read from `source`) admits of its data.
    #[cfg(feature = "text")]
    pub fn encoder_limits(&self, source: &Path) -> crate::data::snli::EncoderLimits {
        crate::data::snli::EncoderLimits {
            max_positions: self.max_position_embeddings,
            vocab_size: self.vocab_size,
            source: source.to_path_buf(),
        }
    }

    /// Reads a Hugging Face `config.json`. A value out of range (a size below 1, a dropout
    /// outside [0, 1), heads that do not divide the width, another activation than gelu) is an
    /// [`Error::BadFile`] naming the field.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(path, format!("not a JSON config.json: {e}")))?;
        // Another architecture's file is named as such, before its fields are missed.
        if let Some(other) = value
            .get("model_type")
            .and_then(|t| t.as_str())
            .filter(|t| !matches!(*t, "bert" | "roberta"))
        {
            return Err(Error::bad_file(
                path,
                format!("model_type {other:?}: expected \"bert\" or \"roberta\""),
            ));
        }
        let config: BertConfig = serde_json::from_value(value)
            .map_err(|e| Error::bad_file(path, format!("not a BERT config.json: {e}")))?;
        if config.hidden_act != "gelu" {
            return Err(Error::bad_file(
                path,
                format!(
                    "hidden_act {:?}: only \"gelu\" is supported",
                    config.hidden_act
                ),
            ));
        }
        for (field, value) in [
            ("vocab_size", config.vocab_size),
            ("hidden_size", config.hidden_size),
            ("num_hidden_layers", config.num_hidden_layers),
            ("num_attention_heads", config.num_attention_heads),
            ("intermediate_size", config.intermediate_size),
            ("max_position_embeddings", config.max_position_embeddings),
            ("type_vocab_size", config.type_vocab_size),
        ] {
            if value < 1 {
                return Err(Error::bad_file(
                    path,
                    format!("{field} {value}: expected at least 1"),
                ));
            }
        }
        if !(config.layer_norm_eps > 0.0 && config.layer_norm_eps.is_finite()) {
            return Err(Error::bad_file(
                path,
                format!(
                    "layer_norm_eps {}: expected a small positive number",
                    config.layer_norm_eps
                ),
            ));
        }
        for (field, value) in [
            (
                "classifier_dropout",
                config.classifier_dropout.unwrap_or(0.0),
            ),
            ("hidden_dropout_prob", config.hidden_dropout_prob),
            (
                "attention_probs_dropout_prob",
                config.attention_probs_dropout_prob,
            ),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Err(Error::bad_file(
                    path,
                    format!("{field} {value}: expected a probability in [0, 1)"),
                ));
            }
        }
        if config.hidden_size % config.num_attention_heads != 0 {
            return Err(Error::bad_file(
                path,
                "hidden_size must be a multiple of num_attention_heads",
            ));
        }
        Ok(config)
    }
}

impl BertConfig {
    /// Whether this is RoBERTa (positions offset past the padding id, its own head, no pooler).
    pub fn is_roberta(&self) -> bool {
        self.model_type == "roberta"
    }

    /// RoBERTa's padding id, from which its positions count (1 unless the config says).
    fn padding_id(&self) -> i64 {
        self.pad_token_id.unwrap_or(1)
    }
}

/// Word, position and token-type embeddings, summed and layer-normalised.
pub(crate) struct Embeddings {
    pub word: Embedding,
    pub position: Embedding,
    pub token_type: Embedding,
    pub norm: LayerNorm,
}

impl Embeddings {
    fn parameters(&self) -> Vec<&Tensor> {
        vec![
            &self.word.weight,
            &self.position.weight,
            &self.token_type.weight,
            &self.norm.weight,
            &self.norm.bias,
        ]
    }
}

/// One transformer encoder layer: self-attention and a feed-forward block, each followed by a
/// residual connection and a LayerNorm.
pub(crate) struct EncoderLayer {
    pub attention: MultiheadAttention,
    pub attention_norm: LayerNorm,
    pub intermediate: LoraLinear,
    pub output: LoraLinear,
    pub output_norm: LayerNorm,
}

/// The classification head on the encoder.
pub enum ClassifierHead {
    /// BERT's: a linear layer on the pooled first token (`classifier`, [classes, hidden]).
    Linear(Linear),
    /// RoBERTa's: dense + tanh, then `out_proj`, on the `<s>` token (`classifier.dense`,
    /// `classifier.out_proj`).
    Dense {
        /// [hidden, hidden].
        dense: Linear,
        /// [classes, hidden].
        out_proj: Linear,
    },
}

/// A BERT-family sequence classifier (see the module docs): sentence pairs
/// (`Features::TextPair`, each [B, T]) -> logits [B, classes].
pub struct BertClassifier {
    vs: nn::VarStore,
    /// The architecture, as read from `config.json`.
    pub config: BertConfig,
    /// `config.json` as read (written back by `Pretrained::hf_config`).
    raw_config: serde_json::Value,
    pub(crate) embeddings: Embeddings,
    pub(crate) layers: Vec<EncoderLayer>,
    /// BERT's pooler on the first token's hidden state, [hidden, hidden] (followed by tanh);
    /// RoBERTa has none.
    pub pooler: Option<Linear>,
    /// The classification head.
    pub classifier: ClassifierHead,
    classes: i64,
}

impl EncoderLayer {
    fn new(p: &nn::Path, c: &BertConfig, lora: Option<&LoraConfig>) -> Result<Self> {
        let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let attn = p / "attention";
        let linear = |p: &nn::Path, i, o| LoraLinear::new(p, i, o, LinearConfig::default(), lora);
        Ok(EncoderLayer {
            attention: MultiheadAttention::from_adapted(
                [
                    linear(&(&attn / "self" / "query"), h, h)?,
                    linear(&(&attn / "self" / "key"), h, h)?,
                    linear(&(&attn / "self" / "value"), h, h)?,
                    linear(&(&attn / "output" / "dense"), h, h)?,
                ],
                AttentionConfig {
                    heads: c.num_attention_heads,
                    dropout: c.attention_probs_dropout_prob,
                },
            )?,
            attention_norm: LayerNorm::new(&(&attn / "output" / "LayerNorm"), h, eps)?,
            intermediate: linear(&(p / "intermediate" / "dense"), h, i)?,
            output: linear(&(p / "output" / "dense"), i, h)?,
            output_norm: LayerNorm::new(&(p / "output" / "LayerNorm"), h, eps)?,
        })
    }

    /// Post-norm transformer layer. `mask`: bool [B, 1, 1, T], true where a key may be attended.
    fn forward(&self, xs: &Tensor, mask: &Tensor, c: &BertConfig, ctx: &mut Ctx) -> Result<Tensor> {
        let p = c.hidden_dropout_prob;
        let attended = self
            .attention
            .forward(xs, Some(mask), ctx)?
            .dropout(p, ctx.train);
        let xs = self.attention_norm.forward(&(attended + xs), ctx)?;
        let inner = self.intermediate.forward(&xs, ctx)?.gelu("none");
        let out = self.output.forward(&inner, ctx)?.dropout(p, ctx.train);
        self.output_norm.forward(&(out + xs), ctx)
    }

    fn projections(&self) -> [&LoraLinear; 6] {
        let a = &self.attention;
        [
            &a.query,
            &a.key,
            &a.value,
            &a.output,
            &self.intermediate,
            &self.output,
        ]
    }

    /// Whether any of the layer's weights trains.
    fn trains(&self) -> bool {
        let norms = [&self.attention_norm, &self.output_norm];
        self.projections().iter().any(|p| projection_trains(p))
            || norms
                .iter()
                .any(|n| n.weight.requires_grad() || n.bias.requires_grad())
    }
}

fn projection_trains(p: &LoraLinear) -> bool {
    p.base.weight.requires_grad()
        || p.base.bias.as_ref().is_some_and(Tensor::requires_grad)
        || p.adapter.is_some()
}

impl BertClassifier {
    /// The architecture with freshly initialised weights (tests and shape checks), training the
    /// last encoder layer, the pooler and the classifier (the paper's choice).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] when `classes` is below 1, or when a width in `config` (vocabulary,
    /// hidden, intermediate, positions, token types) is below 1, its `layer_norm_eps` is not a
    /// finite number above 0, its heads do not divide `hidden_size` or its attention dropout is
    /// not in [0, 1): each error names the layer and the argument ([`BertConfig::from_file`]
    /// refuses such a file first, naming its field).
    pub fn new(device: Device, config: BertConfig, classes: i64) -> Result<Self> {
        Self::with_fine_tuning(
            device,
            config,
            classes,
            &FineTuning::LastLayers { layers: 1 },
        )
    }

    /// The architecture with freshly initialised weights, training what `fine_tuning` says
    /// (its LoRA adapters built on the projections it names).
    pub fn with_fine_tuning(
        device: Device,
        config: BertConfig,
        classes: i64,
        fine_tuning: &FineTuning,
    ) -> Result<Self> {
        let raw_config = serde_json::to_value(RawConfig::of(&config)).unwrap_or_default();
        let model = Self::build(device, config, raw_config, classes, fine_tuning)?;
        fine_tuning.apply(&model)?;
        Ok(model)
    }

    fn build(
        device: Device,
        config: BertConfig,
        raw_config: serde_json::Value,
        classes: i64,
        fine_tuning: &FineTuning,
    ) -> Result<Self> {
        if classes < 1 {
            return Err(Error::bad_value(
                "BertClassifier classes",
                format!("{classes}, expected at least 1"),
            ));
        }
        let architecture = if config.is_roberta() {
            Architecture::Roberta
        } else {
            Architecture::Bert
        };
        let lora = fine_tuning
            .lora()
            .map(|l| crate::hf::lora_for(architecture, l));
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let c = &config;
        let e = &root / "embeddings";
        let embeddings = Embeddings {
            word: Embedding::new(&(&e / "word_embeddings"), c.vocab_size, c.hidden_size)?,
            position: Embedding::new(
                &(&e / "position_embeddings"),
                c.max_position_embeddings,
                c.hidden_size,
            )?,
            token_type: Embedding::new(
                &(&e / "token_type_embeddings"),
                c.type_vocab_size,
                c.hidden_size,
            )?,
            norm: LayerNorm::new(&(&e / "LayerNorm"), c.hidden_size, c.layer_norm_eps)?,
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| EncoderLayer::new(&(&root / "encoder" / "layer" / i), c, lora.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let head = &root / "classifier";
        let fresh = |p: &nn::Path, rows: i64| Linear {
            weight: p.randn("weight", &[rows, c.hidden_size], 0.0, c.initializer_range),
            bias: Some(p.zeros("bias", &[rows])),
        };
        let (pooler, classifier) = if c.is_roberta() {
            let classifier = ClassifierHead::Dense {
                dense: fresh(&(&head / "dense"), c.hidden_size),
                out_proj: fresh(&(&head / "out_proj"), classes),
            };
            (None, classifier)
        } else {
            let pooler = Linear::new(
                &(&root / "pooler" / "dense"),
                c.hidden_size,
                c.hidden_size,
                LinearConfig::default(),
            )?;
            (Some(pooler), ClassifierHead::Linear(fresh(&head, classes)))
        };
        Ok(BertClassifier {
            vs,
            config,
            raw_config,
            embeddings,
            layers,
            pooler,
            classifier,
            classes,
        })
    }

    /// Reads `config.json` and the weights from `dir`, training the last encoder layer, the
    /// pooler and the classifier (the paper's choice). Every encoder, embedding and pooler
    /// tensor must be in the file with its shape; the classifier is loaded when the checkpoint
    /// has one of `classes` rows, and starts fresh otherwise.
    pub fn from_pretrained(dir: &Path, device: Device, classes: i64) -> Result<Self> {
        Self::from_pretrained_with(dir, device, classes, &FineTuning::LastLayers { layers: 1 })
    }

    /// `from_pretrained` training what `fine_tuning` says.
    pub fn from_pretrained_with(
        dir: &Path,
        device: Device,
        classes: i64,
        fine_tuning: &FineTuning,
    ) -> Result<Self> {
        let config_path = dir.join("config.json");
        let config = BertConfig::from_file(&config_path)?;
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
        let raw_config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&config_path, e.to_string()))?;
        let model = Self::build(device, config, raw_config, classes, fine_tuning)?;
        model.load(dir)?;
        fine_tuning.apply(&model)?;
        Ok(model)
    }

    fn load(&self, dir: &Path) -> Result<()> {
        if !dir.join(crate::hf::checkpoint::WEIGHTS_FILE).is_file()
            && !dir.join(crate::hf::checkpoint::INDEX_FILE).is_file()
        {
            return Err(Error::bad_file(dir.join(crate::hf::checkpoint::WEIGHTS_FILE), "no such file; expected BERT weights in safetensors format (run scripts/setup.sh to fetch all-MiniLM-L6-v2)"));
        }
        let checkpoint = Checkpoint::read(dir)?;
        // Our name -> the checkpoint's.
        let stored: HashMap<String, &str> = checkpoint
            .names()
            .into_iter()
            .map(|name| (canonical_name(name), name))
            .collect();
        let prefix = if self.config.is_roberta() {
            "roberta"
        } else {
            "bert"
        };
        let mut vars = self.vs.variables();
        vars.retain(|name, _| !crate::hf::is_adapter(name));
        // The classifier loads only when the checkpoint has all of it with our shapes.
        let head_in_file = vars
            .iter()
            .filter(|(name, _)| name.starts_with("classifier."))
            .all(|(name, var)| {
                stored
                    .get(name.as_str())
                    .is_some_and(|n| checkpoint.take(n, &var.size()).is_ok())
            });
        for (name, var) in vars.iter_mut() {
            if name.starts_with("classifier.") && !head_in_file {
                continue;
            }
            let source = stored.get(name.as_str()).ok_or_else(|| {
                Error::bad_file(
                    &checkpoint.dir,
                    format!("missing tensor {name} (or {prefix}.{name})"),
                )
            })?;
            let tensor = checkpoint.take(source, &var.size())?;
            tch::no_grad(|| var.copy_(&tensor));
        }
        Ok(())
    }

    /// Position ids [B, T] (one row per example, so that the position table's per-sample
    /// gradients are each example's): 0..T for BERT; RoBERTa's count real tokens from its
    /// padding id + 1 and give padding the padding id (`create_position_ids_from_input_ids`).
    fn positions(&self, ids: &Tensor) -> Tensor {
        let (b, t) = (ids.size()[0], ids.size()[1]);
        if self.config.is_roberta() {
            let pad = self.config.padding_id();
            let real = ids.ne(pad).to_kind(Kind::Int64);
            real.cumsum(1, Kind::Int64) * &real + pad
        } else {
            Tensor::arange(t, (Kind::Int64, ids.device()))
                .unsqueeze(0)
                .expand([b, t], false)
        }
    }

    /// Every hidden state of the last encoder layer, [B, T, hidden]. The embeddings and the
    /// layers before the first with a trainable weight run without autograd.
    pub fn encode(
        &self,
        ids: &Tensor,
        types: &Tensor,
        attention_mask: &Tensor,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        let mask = attention_mask
            .gt(0)
            .view([attention_mask.size()[0], 1, 1, -1]);
        let embeddings_train = self
            .embeddings
            .parameters()
            .iter()
            .any(|p| p.requires_grad());
        let first_trained = if embeddings_train {
            0
        } else {
            self.layers
                .iter()
                .position(EncoderLayer::trains)
                .unwrap_or(self.layers.len())
        };
        let embed = |ctx: &mut Ctx| -> Result<Tensor> {
            let e = &self.embeddings;
            let xs = e.word.forward(ids, ctx)?
                + e.position.forward(&self.positions(ids), ctx)?
                + e.token_type.forward(types, ctx)?;
            Ok(e.norm
                .forward(&xs, ctx)?
                .dropout(self.config.hidden_dropout_prob, ctx.train))
        };
        let frozen = |ctx: &mut Ctx| -> Result<Tensor> {
            tch::no_grad(|| {
                let mut xs = embed(ctx)?;
                for layer in &self.layers[..first_trained] {
                    xs = layer.forward(&xs, &mask, &self.config, ctx)?;
                }
                Ok(xs)
            })
        };
        let mut xs = if embeddings_train {
            embed(ctx)?
        } else {
            frozen(ctx)?
        };
        for layer in &self.layers[first_trained..] {
            xs = layer.forward(&xs, &mask, &self.config, ctx)?;
        }
        Ok(xs)
    }
}

impl BertClassifier {
    /// The three [B, T] integer tensors of a sentence-pair batch, T within the position table.
    fn text_pair<'a>(
        &self,
        features: &'a Features,
    ) -> Result<(&'a Tensor, &'a Tensor, &'a Tensor)> {
        let Features::TextPair {
            ids,
            token_types,
            attention_mask,
        } = features
        else {
            return Err(wrong_features("BertClassifier", "sentence pairs", features));
        };
        let size = ids.size();
        if size.len() != 2 || token_types.size() != size || attention_mask.size() != size {
            return Err(Error::bad_value(
                "BertClassifier input",
                format!(
                    "ids {size:?}, token types {:?}, attention mask {:?}, expected three equal [batch, length]",
                    token_types.size(),
                    attention_mask.size()
                ),
            ));
        }
        let offset = if self.config.is_roberta() {
            self.config.padding_id() + 1
        } else {
            0
        };
        if size[1] + offset > self.config.max_position_embeddings {
            return Err(Error::bad_value(
                "BertClassifier input",
                format!(
                    "sequences of {} tokens, longer than the model's {} positions (max_position_embeddings{})",
                    size[1], self.config.max_position_embeddings - offset,
                    if offset > 0 { format!(" less RoBERTa's offset {offset}") } else { String::new() }
                ),
            ));
        }
        for (what, t) in [
            ("token ids", ids),
            ("token type ids", token_types),
            ("attention mask", attention_mask),
        ] {
            check_integer("BertClassifier", what, t)?;
        }
        Ok((ids, token_types, attention_mask))
    }
}

/// `bert.encoder.layer.0.x.gamma` -> `encoder.layer.0.x.weight` (also `roberta.`).
fn canonical_name(name: &str) -> String {
    let name = name
        .strip_prefix("bert.")
        .or_else(|| name.strip_prefix("roberta."))
        .unwrap_or(name);
    if let Some(stem) = name.strip_suffix(".gamma") {
        format!("{stem}.weight")
    } else if let Some(stem) = name.strip_suffix(".beta") {
        format!("{stem}.bias")
    } else {
        name.to_string()
    }
}

/// A `config.json` written from a `BertConfig` alone (a model built without a folder).
#[derive(serde::Serialize)]
struct RawConfig<'a> {
    model_type: &'a str,
    vocab_size: i64,
    hidden_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    intermediate_size: i64,
    hidden_act: &'a str,
    max_position_embeddings: i64,
    type_vocab_size: i64,
    layer_norm_eps: f64,
    hidden_dropout_prob: f64,
    attention_probs_dropout_prob: f64,
    initializer_range: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pad_token_id: Option<i64>,
}

impl<'a> RawConfig<'a> {
    fn of(c: &'a BertConfig) -> Self {
        RawConfig {
            model_type: &c.model_type,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            intermediate_size: c.intermediate_size,
            hidden_act: &c.hidden_act,
            max_position_embeddings: c.max_position_embeddings,
            type_vocab_size: c.type_vocab_size,
            layer_norm_eps: c.layer_norm_eps,
            hidden_dropout_prob: c.hidden_dropout_prob,
            attention_probs_dropout_prob: c.attention_probs_dropout_prob,
            initializer_range: c.initializer_range,
            pad_token_id: c.pad_token_id,
        }
    }
}

impl Model for BertClassifier {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let (ids, token_types, attention_mask) = self.text_pair(features)?;
        let hidden = self.encode(ids, token_types, attention_mask, ctx)?;
        let first = hidden.select(1, 0);
        let dropout = self
            .config
            .classifier_dropout
            .unwrap_or(self.config.hidden_dropout_prob);
        match (&self.pooler, &self.classifier) {
            (Some(pooler), ClassifierHead::Linear(classifier)) => {
                let pooled = pooler
                    .forward(&first, ctx)?
                    .tanh()
                    .dropout(dropout, ctx.train);
                classifier.forward(&pooled, ctx)
            }
            (_, ClassifierHead::Dense { dense, out_proj }) => {
                let xs = dense
                    .forward(&first.dropout(dropout, ctx.train), ctx)?
                    .tanh()
                    .dropout(dropout, ctx.train);
                out_proj.forward(&xs, ctx)
            }
            (None, ClassifierHead::Linear(classifier)) => {
                classifier.forward(&first.dropout(dropout, ctx.train), ctx)
            }
        }
    }

    /// Token ids within the vocabulary, segment ids within `type_vocab_size`, a 0/1 mask.
    fn check_features(&self, features: &Features) -> Result<()> {
        let (ids, token_types, attention_mask) = self.text_pair(features)?;
        let c = &self.config;
        check_range("BertClassifier", "token ids", ids, 0, c.vocab_size)?;
        check_range(
            "BertClassifier",
            "token type ids",
            token_types,
            0,
            c.type_vocab_size,
        )?;
        check_range("BertClassifier", "attention mask", attention_mask, 0, 2)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

impl Pretrained for BertClassifier {
    fn architecture(&self) -> Architecture {
        if self.config.is_roberta() {
            Architecture::Roberta
        } else {
            Architecture::Bert
        }
    }

    fn block_prefixes(&self) -> Vec<String> {
        (0..self.layers.len())
            .map(|i| format!("encoder.layer.{i}."))
            .collect()
    }

    fn head_prefixes(&self) -> Vec<String> {
        vec!["classifier.".into()]
    }

    fn final_prefixes(&self) -> Vec<String> {
        vec!["pooler.".into()]
    }

    fn projections(&self) -> Vec<&LoraLinear> {
        self.layers.iter().flat_map(|l| l.projections()).collect()
    }

    fn hf_name(&self, name: &str) -> String {
        if name.starts_with("classifier.") {
            name.to_string()
        } else {
            let prefix = if self.config.is_roberta() {
                "roberta"
            } else {
                "bert"
            };
            format!("{prefix}.{name}")
        }
    }

    fn hf_tensors(&self) -> Vec<(String, Tensor)> {
        crate::hf::merged_state(self, |name, t| (self.hf_name(name), t))
    }

    fn hf_config(&self) -> serde_json::Value {
        let class = if self.config.is_roberta() {
            "RobertaForSequenceClassification"
        } else {
            "BertForSequenceClassification"
        };
        crate::hf::classifier_config(&self.raw_config, class, self.classes)
    }
}

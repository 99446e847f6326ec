//! SNLI: a Hugging Face BERT encoder (Devlin et al. 2019) loaded from `config.json` +
//! `model.safetensors`, plus its pooler and a 3-way classifier, as the paper fine-tunes
//! bert-base-cased. Everything is frozen except the last encoder layer, the pooler and the
//! classifier; the frozen part runs without autograd, so it costs no gradient work.
//!
//! Parameter names are Hugging Face's (`embeddings.word_embeddings.weight`,
//! `encoder.layer.5.attention.self.query.weight`, ...). Checkpoints with the `bert.` prefix
//! (bert-base-cased) and without it (all-MiniLM-L6-v2) both load; TF-era `gamma`/`beta` names are
//! read as `weight`/`bias`; the masked-LM head (`cls.*`) is ignored.

use super::{check_integer, check_range, wrong_features, Model};
use crate::data::Features;
use crate::error::{Error, Result};
use crate::nn::{
    AttentionConfig, Ctx, Embedding, LayerNorm, Linear, LinearConfig, MultiheadAttention,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// The fields of Hugging Face's `config.json` that the architecture needs.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
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
        let config: BertConfig = serde_json::from_str(&text)
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

/// Word, position and token-type embeddings, summed and layer-normalised.
pub(crate) struct Embeddings {
    pub word: Embedding,
    pub position: Embedding,
    pub token_type: Embedding,
    pub norm: LayerNorm,
}

/// One transformer encoder layer: self-attention and a feed-forward block, each followed by a
/// residual connection and a LayerNorm.
pub(crate) struct EncoderLayer {
    pub attention: MultiheadAttention,
    pub attention_norm: LayerNorm,
    pub intermediate: Linear,
    pub output: Linear,
    pub output_norm: LayerNorm,
}

/// The paper's SNLI model (see the module docs): sentence pairs (`Features::TextPair`, each
/// [B, T]) -> logits [B, classes], only the last encoder layer, the pooler and the classifier
/// trainable.
pub struct BertClassifier {
    vs: nn::VarStore,
    /// The architecture, as read from `config.json`.
    pub config: BertConfig,
    pub(crate) embeddings: Embeddings,
    pub(crate) layers: Vec<EncoderLayer>,
    /// The pooler's dense layer on the first token's hidden state, [hidden, hidden] (followed
    /// by tanh).
    pub pooler: Linear,
    /// The classification head, [classes, hidden] (freshly initialised).
    pub classifier: Linear,
}

impl EncoderLayer {
    fn new(p: &nn::Path, c: &BertConfig) -> Result<Self> {
        let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let attn = p / "attention";
        let linear = |p: &nn::Path, i, o| Linear::new(p, i, o, LinearConfig::default());
        Ok(EncoderLayer {
            attention: MultiheadAttention::from_projections(
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
}

impl BertClassifier {
    /// The architecture with freshly initialised weights (tests and shape checks).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] when `classes` is below 1, or when a width in `config` (vocabulary,
    /// hidden, intermediate, positions, token types) is below 1, its `layer_norm_eps` is not a
    /// finite number above 0, its heads do not divide `hidden_size` or its attention dropout is
    /// not in [0, 1): each error names the layer and the argument ([`BertConfig::from_file`]
    /// refuses such a file first, naming its field).
    pub fn new(device: Device, config: BertConfig, classes: i64) -> Result<Self> {
        if classes < 1 {
            return Err(Error::bad_value(
                "BertClassifier classes",
                format!("{classes}, expected at least 1"),
            ));
        }
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
            .map(|i| EncoderLayer::new(&(&root / "encoder" / "layer" / i), c))
            .collect::<Result<Vec<_>>>()?;
        let pooler = Linear::new(
            &(&root / "pooler" / "dense"),
            c.hidden_size,
            c.hidden_size,
            LinearConfig::default(),
        )?;
        let head = &root / "classifier";
        let classifier = Linear {
            weight: head.randn(
                "weight",
                &[classes, c.hidden_size],
                0.0,
                c.initializer_range,
            ),
            bias: Some(head.zeros("bias", &[classes])),
        };
        let model = BertClassifier {
            vs,
            config,
            embeddings,
            layers,
            pooler,
            classifier,
        };
        model.freeze_all_but_last_layer();
        Ok(model)
    }

    /// Reads `config.json` and `model.safetensors` from `dir`; the classifier head stays freshly
    /// initialised. Every encoder, embedding and pooler tensor must be in the file with its shape.
    pub fn from_pretrained(dir: &Path, device: Device, classes: i64) -> Result<Self> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let model = BertClassifier::new(device, config, classes)?;
        model.load_encoder(&dir.join("model.safetensors"))?;
        Ok(model)
    }

    fn load_encoder(&self, path: &Path) -> Result<()> {
        if !path.is_file() {
            return Err(Error::bad_file(path, "no such file; expected BERT weights in safetensors format (run scripts/setup.sh to fetch all-MiniLM-L6-v2)"));
        }
        let tensors =
            Tensor::read_safetensors(path).map_err(|e| Error::bad_file(path, e.to_string()))?;
        let tensors: HashMap<String, Tensor> = tensors
            .into_iter()
            .map(|(name, t)| (canonical_name(&name), t))
            .collect();
        let mut vars = self.vs.variables();
        vars.retain(|name, _| !name.starts_with("classifier."));
        for (name, var) in vars.iter_mut() {
            let src = tensors.get(name).ok_or_else(|| {
                Error::bad_file(path, format!("missing tensor {name} (or bert.{name})"))
            })?;
            crate::nn::check_loaded(path, name, src, &var.size())?;
            tch::no_grad(|| var.copy_(&src.to_kind(Kind::Float)));
        }
        Ok(())
    }

    /// Only the last encoder layer, the pooler and the classifier train (the paper's choice).
    fn freeze_all_but_last_layer(&self) {
        let last = format!("encoder.layer.{}.", self.config.num_hidden_layers - 1);
        for (name, mut var) in self.vs.variables() {
            let trainable = name.starts_with(&last)
                || name.starts_with("pooler.")
                || name.starts_with("classifier.");
            if !trainable {
                let _ = var.requires_grad_(false);
            }
        }
    }

    /// Embeddings and every encoder layer but the last: run without autograd.
    fn frozen_encoder(
        &self,
        ids: &Tensor,
        types: &Tensor,
        mask: &Tensor,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        tch::no_grad(|| {
            let t = ids.size()[1];
            let positions = Tensor::arange(t, (Kind::Int64, ids.device())).unsqueeze(0);
            let e = &self.embeddings;
            let xs = e.word.forward(ids, ctx)?
                + e.position.forward(&positions, ctx)?
                + e.token_type.forward(types, ctx)?;
            let mut xs = e
                .norm
                .forward(&xs, ctx)?
                .dropout(self.config.hidden_dropout_prob, ctx.train);
            for layer in &self.layers[..self.layers.len() - 1] {
                xs = layer.forward(&xs, mask, &self.config, ctx)?;
            }
            Ok(xs)
        })
    }

    /// Every hidden state of the last encoder layer, [B, T, hidden].
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
        let xs = self.frozen_encoder(ids, types, &mask, ctx)?;
        let last = self.layers.last().expect("BERT has at least one layer");
        last.forward(&xs, &mask, &self.config, ctx)
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
        if size[1] > self.config.max_position_embeddings {
            return Err(Error::bad_value(
                "BertClassifier input",
                format!(
                    "sequences of {} tokens, longer than the model's {} positions (max_position_embeddings)",
                    size[1], self.config.max_position_embeddings
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

/// `bert.encoder.layer.0.x.gamma` -> `encoder.layer.0.x.weight`.
fn canonical_name(name: &str) -> String {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if let Some(stem) = name.strip_suffix(".gamma") {
        format!("{stem}.weight")
    } else if let Some(stem) = name.strip_suffix(".beta") {
        format!("{stem}.bias")
    } else {
        name.to_string()
    }
}

impl Model for BertClassifier {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let (ids, token_types, attention_mask) = self.text_pair(features)?;
        let hidden = self.encode(ids, token_types, attention_mask, ctx)?;
        let pooled = self.pooler.forward(&hidden.select(1, 0), ctx)?.tanh();
        let pooled = pooled.dropout(self.config.hidden_dropout_prob, ctx.train);
        self.classifier.forward(&pooled, ctx)
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

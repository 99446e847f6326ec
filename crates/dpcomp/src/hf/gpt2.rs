//! GPT-2 (Radford et al. 2019) from a Hugging Face folder: `GPT2LMHeadModel` (next-token
//! logits from the token table itself, `lm_head` tied to `transformer.wte`) or
//! `GPT2ForSequenceClassification` (`score` on the last real token), built from dpcomp's
//! recorded layers so that every weight that trains has per-sample gradients.
//!
//! The variables carry Hugging Face's names (`transformer.wte.weight`,
//! `transformer.h.0.attn.c_attn.weight`, `score.weight`, LoRA's
//! `transformer.h.0.attn.c_attn.lora_A.weight`). GPT-2's projections are `Conv1D` layers that
//! store their weight `[in, out]`; here each is a [`LoraLinear`] `[out, in]`, transposed on the
//! way in and out. Checkpoints with the `transformer.` prefix (what `save_pretrained` writes) and
//! without it (the original `gpt2` upload) both load; buffers such as the old `attn.bias` masks
//! are ignored.
//!
//! The blocks are pre-norm: x + attn(ln_1(x)), then x + mlp(ln_2(x)), and `ln_f` after the last.
//! Attention is causal with the padding mask (a key past an example's length is never
//! attended), scaled by 1/√head_dim; the MLP's activation is `gelu_new` (GELU's tanh form).
//! Position ids are 0..T for every row, what transformers uses with right padding. The blocks
//! before the first one with a trainable weight (all but the last k in
//! `FineTuning::LastLayers`), and the embeddings when they are frozen, run without autograd.
//!
//! The classifier reads the last real token of each row (index length − 1). transformers pools
//! the rightmost token that is not `pad_token_id`: the same token wherever the padding id
//! appears only as padding. A text that ends in the padding id itself (fine-tuning recipes set
//! GPT-2's pad to its eos) is pooled at that token here and at the one before it there.
//!
//! A language model whose token table trains (full fine-tuning) uses the table twice, as the
//! lookup and as the head; in a private pass both uses are recorded and the table's per-sample
//! gradients are their sum, its norms formed without instantiating it (`nn::tied`).

use super::{
    classifier_config, is_adapter, lora_for, merged_state, Architecture, Checkpoint, FineTuning,
    Head, Pretrained,
};
use crate::data::Features;
use crate::error::{Error, Result};
use crate::models::{check_range, check_token_shape, wrong_features, Model};
use crate::nn::tied::TiedTable;
use crate::nn::{Ctx, Embedding, LayerNorm, Linear, LinearConfig, LoraConfig, LoraLinear};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// The fields of GPT-2's `config.json` that the architecture needs (transformers' `GPT2Config`
/// names and defaults), with the whole file kept for [`Pretrained::hf_config`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gpt2Config {
    /// Rows of the token table (and columns of the language model's logits).
    pub vocab_size: i64,
    /// Rows of the position table: the longest sequence the model reads.
    pub n_positions: i64,
    /// Width of every hidden state.
    pub n_embd: i64,
    /// Number of transformer blocks.
    pub n_layer: i64,
    /// Attention heads per block; must divide `n_embd`.
    pub n_head: i64,
    /// Width of the MLP's inner layer; `null` (the default) is 4 · `n_embd`.
    #[serde(default)]
    pub n_inner: Option<i64>,
    /// The MLP's activation; only `"gelu_new"` (the default) is supported.
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// The LayerNorms' variance offset (default 1e-5).
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// Dropout on the attention's and the MLP's outputs in training (default 0.1).
    #[serde(default = "default_dropout")]
    pub resid_pdrop: f64,
    /// Dropout on the summed token and position embeddings in training (default 0.1).
    #[serde(default = "default_dropout")]
    pub embd_pdrop: f64,
    /// Dropout on the attention probabilities in training (default 0.1).
    #[serde(default = "default_dropout")]
    pub attn_pdrop: f64,
    /// Standard deviation of the N(0, σ²) initialisation (default 0.02).
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Whether the attention scores are divided by √head_dim (default true).
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    /// Whether block i's scores are also divided by i + 1; only `false` (the default) is
    /// supported.
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Whether the blocks also attend to an encoder's states; only `false` (the default) is
    /// supported.
    #[serde(default)]
    pub add_cross_attention: bool,
    /// Whether the language model's head is the token table; only `true` (the default) is
    /// supported.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// The padding token, if the tokenizer has one (the classifier's pooling uses the lengths).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// The whole `config.json` as read (`null` for a configuration made in code).
    #[serde(skip)]
    pub raw: serde_json::Value,
}

fn default_activation() -> String {
    "gelu_new".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_dropout() -> f64 {
    0.1
}
fn default_init_range() -> f64 {
    0.02
}
fn default_true() -> bool {
    true
}

impl Gpt2Config {
    /// Reads a Hugging Face `config.json`. A value the architecture cannot take (a size below 1,
    /// heads that do not divide `n_embd`, a dropout outside [0, 1), another activation than
    /// `gelu_new`, `scale_attn_by_inverse_layer_idx`, cross-attention, an untied head) is an
    /// [`Error::BadFile`] naming the file and the field.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let raw: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(path, format!("not a JSON config.json: {e}")))?;
        let mut config: Gpt2Config = serde_json::from_value(raw.clone())
            .map_err(|e| Error::bad_file(path, format!("not a GPT-2 config.json: {e}")))?;
        config.raw = raw;
        if let Some(problem) = config.problem() {
            return Err(Error::bad_file(path, problem));
        }
        Ok(config)
    }

    /// The MLP's inner width: `n_inner`, or 4 · `n_embd` when it is `null`.
    pub fn inner(&self) -> i64 {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    /// What is wrong with the values, naming the field; `None` when the model can be built.
    fn problem(&self) -> Option<String> {
        if self.activation_function != "gelu_new" {
            return Some(format!(
                "activation_function {:?}: only \"gelu_new\" is supported",
                self.activation_function
            ));
        }
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("n_positions", self.n_positions),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_inner", self.inner()),
        ] {
            if value < 1 {
                return Some(format!("{field} {value}: expected at least 1"));
            }
        }
        if self.n_embd % self.n_head != 0 {
            return Some(format!(
                "n_head {}: expected a divisor of n_embd {}",
                self.n_head, self.n_embd
            ));
        }
        if !(self.layer_norm_epsilon > 0.0 && self.layer_norm_epsilon.is_finite()) {
            return Some(format!(
                "layer_norm_epsilon {}: expected a small positive number",
                self.layer_norm_epsilon
            ));
        }
        for (field, value) in [
            ("resid_pdrop", self.resid_pdrop),
            ("embd_pdrop", self.embd_pdrop),
            ("attn_pdrop", self.attn_pdrop),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Some(format!("{field} {value}: expected a probability in [0, 1)"));
            }
        }
        if !(self.initializer_range > 0.0 && self.initializer_range.is_finite()) {
            return Some(format!(
                "initializer_range {}: expected a finite number above 0",
                self.initializer_range
            ));
        }
        if self.scale_attn_by_inverse_layer_idx {
            return Some("scale_attn_by_inverse_layer_idx true: only false is supported".into());
        }
        if self.add_cross_attention {
            return Some(
                "add_cross_attention true: only false (a decoder alone) is supported".into(),
            );
        }
        if !self.tie_word_embeddings {
            return Some(
                "tie_word_embeddings false: only GPT-2's tied head (lm_head = transformer.wte) is supported"
                    .into(),
            );
        }
        None
    }
}

/// One pre-norm transformer block (`transformer.h.{i}`).
#[derive(Debug)]
pub struct Block {
    /// The norm before the attention (`ln_1`).
    pub ln_1: LayerNorm,
    /// Queries, keys and values at once, n_embd -> 3 · n_embd (`attn.c_attn`).
    pub c_attn: LoraLinear,
    /// The heads' concatenation back to n_embd (`attn.c_proj`).
    pub attn_proj: LoraLinear,
    /// The norm before the MLP (`ln_2`).
    pub ln_2: LayerNorm,
    /// The MLP's first layer, n_embd -> inner (`mlp.c_fc`).
    pub c_fc: LoraLinear,
    /// The MLP's second layer, inner -> n_embd (`mlp.c_proj`).
    pub mlp_proj: LoraLinear,
}

impl Block {
    fn new(p: &nn::Path, c: &Gpt2Config, lora: Option<&LoraConfig>) -> Result<Self> {
        let (d, inner, eps) = (c.n_embd, c.inner(), c.layer_norm_epsilon);
        let linear = |p: &nn::Path, i, o| LoraLinear::new(p, i, o, LinearConfig::default(), lora);
        Ok(Block {
            ln_1: LayerNorm::new(&(p / "ln_1"), d, eps)?,
            c_attn: linear(&(p / "attn" / "c_attn"), d, 3 * d)?,
            attn_proj: linear(&(p / "attn" / "c_proj"), d, d)?,
            ln_2: LayerNorm::new(&(p / "ln_2"), d, eps)?,
            c_fc: linear(&(p / "mlp" / "c_fc"), d, inner)?,
            mlp_proj: linear(&(p / "mlp" / "c_proj"), inner, d)?,
        })
    }

    fn projections(&self) -> [&LoraLinear; 4] {
        [&self.c_attn, &self.attn_proj, &self.c_fc, &self.mlp_proj]
    }

    /// Whether any of the block's weights (adapters included) trains.
    fn trains(&self) -> bool {
        let norms = [&self.ln_1, &self.ln_2]
            .into_iter()
            .any(|n| n.weight.requires_grad() || n.bias.requires_grad());
        norms
            || self.projections().into_iter().any(|p| {
                let base = &p.base;
                base.weight.requires_grad()
                    || base.bias.as_ref().is_some_and(Tensor::requires_grad)
                    || p.adapter
                        .as_ref()
                        .is_some_and(|a| a.a.weight.requires_grad() || a.b.weight.requires_grad())
            })
    }

    /// xs [B, T, n_embd]; `mask` bool [B, 1, T, T], true where query t may attend to key s.
    fn forward(&self, xs: &Tensor, mask: &Tensor, c: &Gpt2Config, ctx: &mut Ctx) -> Result<Tensor> {
        let (b, t, d) = (xs.size()[0], xs.size()[1], c.n_embd);
        let head_dim = d / c.n_head;
        let qkv = self.c_attn.forward(&self.ln_1.forward(xs, ctx)?, ctx)?;
        let heads = |i: i64| {
            qkv.narrow(2, i * d, d)
                .view([b, t, c.n_head, head_dim])
                .transpose(1, 2)
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let scale = if c.scale_attn_weights {
            1.0 / (head_dim as f64).sqrt()
        } else {
            1.0
        };
        let dropout = if ctx.train { c.attn_pdrop } else { 0.0 };
        let attended = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            Some(mask),
            dropout,
            false,
            Some(scale),
            false,
        )
        .map_err(|e| Error::bad_value("Gpt2 attention", e.to_string()))?
        .transpose(1, 2)
        .reshape([b, t, d]);
        let attended = self
            .attn_proj
            .forward(&attended, ctx)?
            .dropout(c.resid_pdrop, ctx.train);
        let xs = xs + attended;
        let inner = self
            .c_fc
            .forward(&self.ln_2.forward(&xs, ctx)?, ctx)?
            .gelu("tanh");
        let out = self
            .mlp_proj
            .forward(&inner, ctx)?
            .dropout(c.resid_pdrop, ctx.train);
        Ok(xs + out)
    }
}

/// GPT-2 with a language-model or a classification head (see the module docs): token
/// sequences (`Features::Tokens`, right padding) -> logits, [B, T, vocab_size] for
/// [`Head::CausalLm`], [B, classes] for [`Head::SequenceClassification`].
pub struct Gpt2 {
    vs: nn::VarStore,
    /// The architecture, as read from `config.json`.
    pub config: Gpt2Config,
    /// What sits on top of `ln_f`.
    pub head: Head,
    /// The token table [vocab_size, n_embd] (`transformer.wte`), also the language model's head.
    pub wte: Embedding,
    /// The position table [n_positions, n_embd] (`transformer.wpe`).
    pub wpe: Embedding,
    /// The transformer blocks (`transformer.h.{i}`).
    pub blocks: Vec<Block>,
    /// The norm after the last block (`transformer.ln_f`).
    pub ln_f: LayerNorm,
    /// The classification head [classes, n_embd] without bias (`score`); `None` for the
    /// language model.
    pub score: Option<Linear>,
}

impl Gpt2 {
    /// The architecture with weights drawn as transformers' `_init_weights` draws them: every
    /// projection, embedding and the head N(0, initializer_range²), the residual projections
    /// (`attn.c_proj`, `mlp.c_proj`) N(0, initializer_range² / (2 · n_layer)), biases 0,
    /// LayerNorms 1 and 0; LoRA adapters on the projections `lora` targets (A uniform, B zero).
    /// Every weight trains ([`FineTuning::apply`] freezes what a mode does not train).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] naming the field when `config` holds a value the architecture cannot
    /// take (as [`Gpt2Config::from_file`] refuses it), when a classification head has fewer
    /// than 1 class, or when the LoRA settings are invalid.
    pub fn new(
        config: Gpt2Config,
        device: Device,
        head: Head,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        if let Some(problem) = config.problem() {
            return Err(Error::bad_value("Gpt2 config", problem));
        }
        if let Head::SequenceClassification { classes } = head {
            if classes < 1 {
                return Err(Error::bad_value(
                    "Gpt2 classes",
                    format!("{classes}, expected at least 1"),
                ));
            }
        }
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let c = &config;
        let t = &root / "transformer";
        let wte = Embedding::new(&(&t / "wte"), c.vocab_size, c.n_embd)?;
        let wpe = Embedding::new(&(&t / "wpe"), c.n_positions, c.n_embd)?;
        let blocks = (0..c.n_layer)
            .map(|i| Block::new(&(&t / "h" / i), c, lora))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&(&t / "ln_f"), c.n_embd, c.layer_norm_epsilon)?;
        let score = match head {
            Head::SequenceClassification { classes } => Some(Linear {
                weight: (&root / "score").var(
                    "weight",
                    &[classes, c.n_embd],
                    nn::Init::Randn {
                        mean: 0.0,
                        stdev: c.initializer_range,
                    },
                ),
                bias: None,
            }),
            Head::CausalLm => None,
        };
        let std = c.initializer_range;
        let residual_std = std / ((2 * c.n_layer) as f64).sqrt();
        tch::no_grad(|| {
            for table in [&wte, &wpe] {
                let _ = table.weight.shallow_clone().normal_(0.0, std);
            }
            for block in &blocks {
                for (projection, std) in [
                    (&block.c_attn, std),
                    (&block.attn_proj, residual_std),
                    (&block.c_fc, std),
                    (&block.mlp_proj, residual_std),
                ] {
                    let _ = projection.base.weight.shallow_clone().normal_(0.0, std);
                    if let Some(bias) = &projection.base.bias {
                        let _ = bias.shallow_clone().zero_();
                    }
                }
            }
        });
        Ok(Gpt2 {
            vs,
            config,
            head,
            wte,
            wpe,
            blocks,
            ln_f,
            score,
        })
    }

    /// Reads `dir/config.json` and the checkpoint (`model.safetensors` or its shards), builds the
    /// model with the adapters `fine_tuning` adds (LoRA's default target for GPT-2 is `c_attn`),
    /// loads every tensor and freezes what the mode does not train. A classification head's
    /// `score.weight` is read when the checkpoint holds it and drawn N(0, initializer_range²)
    /// otherwise; a language model's head is the token table.
    ///
    /// # Errors
    ///
    /// [`Error::BadFile`] naming the file and the field or tensor: a config value the model
    /// cannot take, a missing tensor, one of another shape (GPT-2's `Conv1D` weights are
    /// `[in, out]`) or with NaNs; [`Error::BadValue`] when the fine-tuning mode trains nothing of
    /// the model (more layers than it has, LoRA targets that name no projection).
    pub fn from_pretrained(
        dir: &Path,
        device: Device,
        head: Head,
        fine_tuning: &FineTuning,
    ) -> Result<Self> {
        let config = Gpt2Config::from_file(&dir.join("config.json"))?;
        let lora = fine_tuning.lora().map(|l| lora_for(Architecture::Gpt2, l));
        let model = Gpt2::new(config, device, head, lora.as_ref())?;
        let checkpoint = Checkpoint::read(dir)?;
        model.load(&checkpoint)?;
        fine_tuning.apply(&model)?;
        Ok(model)
    }

    /// Copies every weight but the adapters from `checkpoint` (see `from_pretrained`).
    fn load(&self, checkpoint: &Checkpoint) -> Result<()> {
        let conv1d: HashSet<String> = self
            .projections()
            .iter()
            .map(|p| format!("{}.weight", p.name))
            .collect();
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut var) in vars {
            if is_adapter(&name) {
                continue;
            }
            if name.starts_with("score.") && !checkpoint.contains(&name) {
                continue;
            }
            let stored = match name.strip_prefix("transformer.") {
                _ if checkpoint.contains(&name) => name.clone(),
                Some(short) if checkpoint.contains(short) => short.to_string(),
                Some(short) => {
                    return Err(Error::bad_file(
                        &checkpoint.dir,
                        format!(
                            "missing tensor {name} (or {short}): the checkpoint does not hold it"
                        ),
                    ))
                }
                None => {
                    return Err(Error::bad_file(
                        &checkpoint.dir,
                        format!("missing tensor {name}: the checkpoint does not hold it"),
                    ))
                }
            };
            let value = if conv1d.contains(&name) {
                let size = var.size();
                checkpoint.take(&stored, &[size[1], size[0]])?.tr()
            } else {
                checkpoint.take(&stored, &var.size())?
            };
            tch::no_grad(|| var.copy_(&value));
        }
        Ok(())
    }

    /// The hidden states after `ln_f`, [B, T, n_embd], for ids [B, T] and lengths \[B\].
    /// `tied`: a language model's tied table on the tape (`tied_table`).
    fn hidden(
        &self,
        ids: &Tensor,
        lengths: &Tensor,
        tied: Option<&TiedTable>,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = (ids.size()[0], ids.size()[1]);
        let device = ids.device();
        let positions = Tensor::arange(t, (Kind::Int64, device));
        let lengths = lengths.to_device(device).to_kind(Kind::Int64);
        // Key s is attended from query t when s <= t (causal) and s < the example's length.
        let keys = positions.view([1, t]).lt_tensor(&lengths.view([b, 1]));
        let causal = positions.view([1, t]).le_tensor(&positions.view([t, 1]));
        let mask = keys
            .view([b, 1, 1, t])
            .logical_and(&causal.view([1, 1, t, t]));
        let positions = positions.view([1, t]).expand([b, t], false);
        let embed = |ctx: &mut Ctx| -> Result<Tensor> {
            let tokens = match tied {
                Some(table) => {
                    if !matches!(ids.kind(), Kind::Int64 | Kind::Int) {
                        return Err(Error::bad_value(
                            "Gpt2 input",
                            format!("token ids of kind {:?}, expected Int64 or Int", ids.kind()),
                        ));
                    }
                    table.lookup(&self.wte.weight, ids, ctx)?
                }
                None => self.wte.forward(ids, ctx)?,
            };
            let xs = tokens + self.wpe.forward(&positions, ctx)?;
            Ok(xs.dropout(c.embd_pdrop, ctx.train))
        };
        let embeddings_train = self.wte.weight.requires_grad() || self.wpe.weight.requires_grad();
        let mut xs = if embeddings_train {
            embed(ctx)?
        } else {
            tch::no_grad(|| embed(ctx))?
        };
        for block in &self.blocks {
            xs = if block.trains() || xs.requires_grad() {
                block.forward(&xs, &mask, c, ctx)?
            } else {
                tch::no_grad(|| block.forward(&xs, &mask, c, ctx))?
            };
        }
        self.ln_f.forward(&xs, ctx)
    }

    /// In a private pass of a language model whose token table trains, the table's two uses
    /// (lookup and head), whose per-sample gradients are summed (`nn::tied`).
    fn tied_table(&self, ctx: &mut Ctx) -> Option<TiedTable> {
        (self.head == Head::CausalLm && self.wte.weight.requires_grad() && ctx.tape().is_some())
            .then(TiedTable::default)
    }

    /// ids [B, T] and lengths \[B\] of a token batch, T from 1 to `n_positions` (sizes only).
    fn tokens<'a>(&self, features: &'a Features) -> Result<(&'a Tensor, &'a Tensor)> {
        let Features::Tokens { ids, lengths } = features else {
            return Err(wrong_features("Gpt2", "token sequences", features));
        };
        check_token_shape("Gpt2", ids, lengths)?;
        let t = ids.size()[1];
        if t < 1 || t > self.config.n_positions {
            return Err(Error::bad_value(
                "Gpt2 input",
                format!(
                    "sequences of {t} tokens, expected 1 to {} (n_positions)",
                    self.config.n_positions
                ),
            ));
        }
        Ok((ids, lengths))
    }
}

impl Model for Gpt2 {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let (ids, lengths) = self.tokens(features)?;
        let tied = self.tied_table(ctx);
        let hidden = self.hidden(ids, lengths, tied.as_ref(), ctx)?;
        match (&self.score, tied) {
            (Some(score), _) => {
                let (b, d) = (ids.size()[0], self.config.n_embd);
                let last = (lengths.to_device(ids.device()).to_kind(Kind::Int64) - 1)
                    .view([b, 1, 1])
                    .expand([b, 1, d], false);
                score.forward(&hidden.gather(1, &last, false).squeeze_dim(1), ctx)
            }
            (None, Some(table)) => Ok(table.head(&self.wte.weight, &hidden, ctx)),
            (None, None) => Ok(hidden.linear::<Tensor>(&self.wte.weight, None)),
        }
    }

    /// Token ids within the vocabulary, lengths from 1 to T, T within `n_positions`.
    fn check_features(&self, features: &Features) -> Result<()> {
        let (ids, lengths) = self.tokens(features)?;
        check_range("Gpt2", "token ids", ids, 0, self.config.vocab_size)?;
        check_range("Gpt2", "lengths", lengths, 1, ids.size()[1] + 1)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// A language model's loss of each sequence: the mean cross-entropy of its next tokens
    /// (`hf::next_token_losses`); a classifier's, the cross-entropy against its label.
    fn example_losses(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_example_losses(self.score.is_none(), output, features, labels)
    }

    fn mean_loss(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_mean_loss(self.score.is_none(), output, features, labels)
    }

    /// A language model's accuracy of a sequence is its share of next tokens predicted right.
    fn correct(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_correct(self.score.is_none(), output, features, labels)
    }
}

impl Pretrained for Gpt2 {
    fn architecture(&self) -> Architecture {
        Architecture::Gpt2
    }

    fn block_prefixes(&self) -> Vec<String> {
        (0..self.blocks.len())
            .map(|i| format!("transformer.h.{i}."))
            .collect()
    }

    fn head_prefixes(&self) -> Vec<String> {
        match self.head {
            Head::SequenceClassification { .. } => vec!["score.".into()],
            Head::CausalLm => Vec::new(),
        }
    }

    fn final_prefixes(&self) -> Vec<String> {
        vec!["transformer.ln_f.".into()]
    }

    fn projections(&self) -> Vec<&LoraLinear> {
        self.blocks.iter().flat_map(Block::projections).collect()
    }

    /// What `GPT2LMHeadModel` / `GPT2ForSequenceClassification` `save_pretrained` write:
    /// `transformer.*` (projections merged with their adapters and transposed to `Conv1D`'s
    /// `[in, out]`) and `score.weight`; no `lm_head.weight` (it is `transformer.wte.weight`).
    fn hf_tensors(&self) -> Vec<(String, Tensor)> {
        let conv1d: HashSet<String> = self
            .projections()
            .iter()
            .map(|p| format!("{}.weight", p.name))
            .collect();
        merged_state(self, |name, value| {
            let value = if conv1d.contains(name) {
                value.tr().contiguous()
            } else {
                value
            };
            (name.to_string(), value)
        })
    }

    /// The `config.json` read (or this configuration's fields where it was made in code), with
    /// `dtype` float32 (what `hf_tensors` are written as) and `architectures` naming the head's
    /// class; a classifier's also counts its classes (`id2label`, `label2id`).
    fn hf_config(&self) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let mut config = match &self.config.raw {
            Value::Object(fields) => fields.clone(),
            _ => Map::new(),
        };
        if let Ok(Value::Object(fields)) = serde_json::to_value(&self.config) {
            config.extend(fields);
        }
        config.insert("model_type".into(), json!("gpt2"));
        config.insert("dtype".into(), json!("float32"));
        if config.contains_key("torch_dtype") {
            config.insert("torch_dtype".into(), json!("float32"));
        }
        let config = Value::Object(config);
        match self.head {
            Head::SequenceClassification { classes } => {
                classifier_config(&config, "GPT2ForSequenceClassification", classes)
            }
            Head::CausalLm => {
                let mut config = config;
                config["architectures"] = json!(["GPT2LMHeadModel"]);
                config
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Gpt2Config {
        serde_json::from_str(
            r#"{"vocab_size": 30, "n_positions": 8, "n_embd": 8, "n_layer": 2, "n_head": 2}"#,
        )
        .unwrap()
    }

    #[test]
    fn bad_configs_are_named_by_field() {
        type Change = fn(&mut Gpt2Config);
        let cases: [(Change, &str); 5] = [
            (
                |c| c.activation_function = "relu".into(),
                "activation_function \"relu\"",
            ),
            (|c| c.n_head = 3, "n_head 3: expected a divisor of n_embd 8"),
            (|c| c.n_inner = Some(0), "n_inner 0: expected at least 1"),
            (|c| c.attn_pdrop = -0.1, "attn_pdrop -0.1"),
            (
                |c| c.scale_attn_by_inverse_layer_idx = true,
                "scale_attn_by_inverse_layer_idx",
            ),
        ];
        for (change, expected) in cases {
            let mut config = tiny();
            change(&mut config);
            let error = Gpt2::new(config, Device::Cpu, Head::CausalLm, None)
                .err()
                .expect("refused")
                .to_string();
            assert!(error.contains(expected), "{error}");
        }
        assert!(tiny().problem().is_none());
    }
}

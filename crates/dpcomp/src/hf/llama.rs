//! The Llama family (Touvron et al. 2023) as Hugging Face's `transformers` defines it
//! (`LlamaForCausalLM`, `LlamaForSequenceClassification`), built from dpcomp's recorded layers:
//! token embeddings, then per block a pre-norm attention with rotary positions (Su et al. 2021)
//! and grouped-query heads, and a pre-norm SwiGLU feed-forward block, each with a residual
//! connection; a final RMS norm and a head.
//!
//! Variables carry Hugging Face's names (`model.embed_tokens.weight`,
//! `model.layers.0.self_attn.q_proj.weight`, `model.layers.0.mlp.gate_proj.weight`,
//! `model.layers.0.input_layernorm.weight`, `model.norm.weight`, `lm_head.weight`,
//! `score.weight`), so a LoRA adapter sits at `model.layers.0.self_attn.q_proj.lora_A.weight`.
//!
//! Inputs are right-padded token sequences (`Features::Tokens`: ids [B, T], lengths \[B\]);
//! position p of every row has position p, a key is attended to when it is at most the query's
//! position and within its row's length. The classification head reads the last real token of
//! each row (`transformers` finds it as the last id that is not `pad_token_id`, the same token
//! for right-padded rows whose tokens are not the padding id).

use super::{
    classifier_config, is_adapter, lora_for, merged_state, Architecture, Checkpoint, FineTuning,
};
use super::{Head, Pretrained};
use crate::data::Features;
use crate::error::{Error, Result};
use crate::models::{check_range, check_token_shape, wrong_features, Model};
use crate::nn::tied::TiedTable;
use crate::nn::{Ctx, Embedding, Linear, LinearConfig, LoraConfig, LoraLinear, RmsNorm};
use serde::Deserialize;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// What `config.json` says of a Llama model, checked. The file's own text is kept
/// (`LlamaConfig::raw`) and written back with the model (`Pretrained::hf_config`).
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// Rows of the token embedding table.
    pub vocab_size: i64,
    /// Width of every hidden state.
    pub hidden_size: i64,
    /// Width of the SwiGLU feed-forward layer.
    pub intermediate_size: i64,
    /// Number of decoder blocks.
    pub num_hidden_layers: i64,
    /// Query heads per block.
    pub num_attention_heads: i64,
    /// Key/value heads per block, a divisor of the query heads (grouped-query attention; equal
    /// to the query heads when the file does not say).
    pub num_key_value_heads: i64,
    /// Width of one head (`head_dim`, or hidden_size / num_attention_heads), even.
    pub head_dim: i64,
    /// The longest sequence the model reads.
    pub max_position_embeddings: i64,
    /// The RMS norms' offset.
    pub rms_norm_eps: f64,
    /// θ of the rotary embedding: inverse frequencies 1 / θ^(2i/d).
    pub rope_theta: f64,
    /// Whether the attention projections have biases.
    pub attention_bias: bool,
    /// Whether the feed-forward projections have biases.
    pub mlp_bias: bool,
    /// Whether the language-model head is the embedding table itself.
    pub tie_word_embeddings: bool,
    /// Dropout on the attention probabilities in training, in [0, 1).
    pub attention_dropout: f64,
    /// σ of the N(0, σ²) initialisation of the projections, embeddings and head.
    pub initializer_range: f64,
    /// The padding token, whose embedding row starts at zero in a fresh model.
    pub pad_token_id: Option<i64>,
    /// The file as read (every field, those dpcomp does not use too).
    pub raw: serde_json::Value,
}

/// The fields as `transformers` 4 and 5 write them, with `LlamaConfig`'s defaults for those a
/// file leaves out.
#[derive(Deserialize)]
struct Fields {
    model_type: Option<String>,
    #[serde(default = "default_vocab")]
    vocab_size: i64,
    #[serde(default = "default_hidden")]
    hidden_size: i64,
    #[serde(default = "default_intermediate")]
    intermediate_size: i64,
    #[serde(default = "default_layers")]
    num_hidden_layers: i64,
    #[serde(default = "default_heads")]
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    #[serde(default = "default_positions")]
    max_position_embeddings: i64,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_dropout: Option<f64>,
    #[serde(default = "default_init_range")]
    initializer_range: f64,
    pad_token_id: Option<i64>,
}

fn default_vocab() -> i64 {
    32000
}
fn default_hidden() -> i64 {
    4096
}
fn default_intermediate() -> i64 {
    11008
}
fn default_layers() -> i64 {
    32
}
fn default_heads() -> i64 {
    32
}
fn default_positions() -> i64 {
    2048
}
fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}
fn default_init_range() -> f64 {
    0.02
}

/// θ when neither `rope_parameters` nor `rope_theta` gives one (`transformers`' default).
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

impl LlamaConfig {
    /// Reads and checks a Llama `config.json`.
    ///
    /// # Errors
    ///
    /// [`Error::BadFile`] naming the file and the field: another `model_type` than `llama`, an
    /// activation other than `silu`, a rotary embedding with scaling (`rope_parameters.rope_type`
    /// other than `default`), a size below 1, heads that the key/value heads do not divide, an
    /// odd head width, an ε, θ or σ that is not a positive finite number, a dropout outside
    /// [0, 1).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let raw: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(path, format!("not a JSON config: {e}")))?;
        Self::from_json(raw, path)
    }

    /// Checks `raw`, the text of `config.json` (`source` names it in errors), as
    /// [`LlamaConfig::from_file`] does.
    ///
    /// ```
    /// use dpcomp::hf::llama::LlamaConfig;
    /// let raw = serde_json::json!({
    ///     "model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 32,
    ///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    ///     "rope_theta": 500000.0,
    /// });
    /// let config = LlamaConfig::from_json(raw.clone(), "config.json".as_ref())?;
    /// assert_eq!((config.head_dim, config.rope_theta), (4, 500000.0));
    /// let mut scaled = raw;
    /// scaled["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    /// let error = LlamaConfig::from_json(scaled, "config.json".as_ref()).unwrap_err();
    /// assert!(error.to_string().contains("rope_scaling.rope_type \"llama3\""), "{error}");
    /// # Ok::<(), dpcomp::Error>(())
    /// ```
    pub fn from_json(raw: serde_json::Value, source: &Path) -> Result<Self> {
        let fields: Fields = serde_json::from_value(raw.clone())
            .map_err(|e| Error::bad_file(source, format!("not a Llama config.json: {e}")))?;
        let bad = |what: String| Error::bad_file(source, what);
        if let Some(model_type) = fields.model_type.as_deref().filter(|&t| t != "llama") {
            return Err(bad(format!(
                "model_type {model_type:?}: expected \"llama\""
            )));
        }
        if fields.hidden_act != "silu" {
            return Err(bad(format!(
                "hidden_act {:?}: only \"silu\" is supported",
                fields.hidden_act
            )));
        }
        let rope_theta = rope_theta(&fields).map_err(bad)?;
        let num_key_value_heads = fields
            .num_key_value_heads
            .unwrap_or(fields.num_attention_heads);
        let head_dim = match fields.head_dim {
            Some(d) => d,
            None if fields.num_attention_heads > 0 => {
                fields.hidden_size / fields.num_attention_heads
            }
            None => 0,
        };
        let config = LlamaConfig {
            vocab_size: fields.vocab_size,
            hidden_size: fields.hidden_size,
            intermediate_size: fields.intermediate_size,
            num_hidden_layers: fields.num_hidden_layers,
            num_attention_heads: fields.num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: fields.max_position_embeddings,
            rms_norm_eps: fields.rms_norm_eps,
            rope_theta,
            attention_bias: fields.attention_bias,
            mlp_bias: fields.mlp_bias,
            tie_word_embeddings: fields.tie_word_embeddings,
            attention_dropout: fields.attention_dropout.unwrap_or(0.0),
            initializer_range: fields.initializer_range,
            pad_token_id: fields.pad_token_id,
            raw,
        };
        config.check().map_err(bad)?;
        Ok(config)
    }

    /// The values' ranges; the message names the field.
    fn check(&self) -> std::result::Result<(), String> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value < 1 {
                return Err(format!("{field} {value}: expected at least 1"));
            }
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(format!(
                "num_attention_heads {}: expected a divisor of hidden_size {}",
                self.num_attention_heads, self.hidden_size
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "num_key_value_heads {}: expected a divisor of num_attention_heads {}",
                self.num_key_value_heads, self.num_attention_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {}: expected an even width (the rotary embedding turns pairs)",
                self.head_dim
            ));
        }
        for (field, value) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!("{field} {value}: expected a finite number above 0"));
            }
        }
        if !(self.initializer_range.is_finite() && self.initializer_range >= 0.0) {
            return Err(format!(
                "initializer_range {}: expected a finite number of at least 0",
                self.initializer_range
            ));
        }
        if !(0.0..1.0).contains(&self.attention_dropout) {
            return Err(format!(
                "attention_dropout {}: expected a probability in [0, 1)",
                self.attention_dropout
            ));
        }
        Ok(())
    }
}

/// θ from `rope_parameters` (`transformers` 5) or `rope_scaling` (its name in `transformers`
/// 4), else from `rope_theta`, else 10000; a rotary embedding with scaling is refused, naming
/// the field.
fn rope_theta(fields: &Fields) -> std::result::Result<f64, String> {
    let given = [
        ("rope_parameters", &fields.rope_parameters),
        ("rope_scaling", &fields.rope_scaling),
    ];
    let parameters = given
        .into_iter()
        .find_map(|(name, value)| value.as_ref().filter(|v| !v.is_null()).map(|v| (name, v)));
    let Some((name, parameters)) = parameters else {
        return Ok(fields.rope_theta.unwrap_or(DEFAULT_ROPE_THETA));
    };
    let Some(parameters) = parameters.as_object() else {
        return Err(format!(
            "{name} {parameters}: expected an object with rope_type and rope_theta"
        ));
    };
    for key in ["rope_type", "type"] {
        match parameters.get(key) {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(t)) if t == "default" => break,
            Some(other) => {
                return Err(format!(
                    "{name}.{key} {other}: only \"default\" rotary embeddings (no scaling) are supported"
                ))
            }
        }
    }
    match parameters.get("rope_theta") {
        None | Some(serde_json::Value::Null) => Ok(fields.rope_theta.unwrap_or(DEFAULT_ROPE_THETA)),
        Some(theta) => theta
            .as_f64()
            .ok_or_else(|| format!("{name}.rope_theta {theta}: expected a number")),
    }
}

/// Grouped-query self-attention with rotary positions on the queries and keys.
struct Attention {
    q_proj: LoraLinear,
    k_proj: LoraLinear,
    v_proj: LoraLinear,
    o_proj: LoraLinear,
}

/// The SwiGLU feed-forward block: down(silu(gate(x)) ⊙ up(x)).
struct Mlp {
    gate_proj: LoraLinear,
    up_proj: LoraLinear,
    down_proj: LoraLinear,
}

/// One decoder block (`LlamaDecoderLayer`).
struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// What one forward pass shares between its blocks.
struct Positions {
    /// cos and sin of the rotary angles, [T, head_dim] each.
    cos: Tensor,
    sin: Tensor,
    /// Where a query may attend: bool [B, 1, T, T], key at most the query's position and
    /// within the row.
    mask: Tensor,
}

/// A Llama model with a language-model or a classification head (see the module docs).
pub struct Llama {
    vs: nn::VarStore,
    /// The architecture, as read from `config.json`.
    pub config: LlamaConfig,
    /// What sits on the last hidden states.
    pub head: Head,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    /// The language-model head [vocabulary, hidden] (`lm_head`; the embedding table when tied)
    /// or the classification head [classes, hidden] (`score`); neither has a bias.
    output: Linear,
    /// 1 / θ^(2i/d), i < d/2, float32 (`LlamaRotaryEmbedding::inv_freq`).
    inv_freq: Tensor,
}

impl Block {
    fn new(p: &nn::Path, c: &LlamaConfig, lora: Option<&LoraConfig>) -> Result<Self> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let attention = LinearConfig {
            bias: c.attention_bias,
        };
        let mlp = LinearConfig { bias: c.mlp_bias };
        let attn = p / "self_attn";
        let feed = p / "mlp";
        let q_out = c.num_attention_heads * d;
        let kv_out = c.num_key_value_heads * d;
        let i = c.intermediate_size;
        Ok(Block {
            input_layernorm: RmsNorm::new(&(p / "input_layernorm"), h, c.rms_norm_eps)?,
            self_attn: Attention {
                q_proj: LoraLinear::new(&(&attn / "q_proj"), h, q_out, attention, lora)?,
                k_proj: LoraLinear::new(&(&attn / "k_proj"), h, kv_out, attention, lora)?,
                v_proj: LoraLinear::new(&(&attn / "v_proj"), h, kv_out, attention, lora)?,
                o_proj: LoraLinear::new(&(&attn / "o_proj"), q_out, h, attention, lora)?,
            },
            post_attention_layernorm: RmsNorm::new(
                &(p / "post_attention_layernorm"),
                h,
                c.rms_norm_eps,
            )?,
            mlp: Mlp {
                gate_proj: LoraLinear::new(&(&feed / "gate_proj"), h, i, mlp, lora)?,
                up_proj: LoraLinear::new(&(&feed / "up_proj"), h, i, mlp, lora)?,
                down_proj: LoraLinear::new(&(&feed / "down_proj"), i, h, mlp, lora)?,
            },
        })
    }

    fn projections(&self) -> [&LoraLinear; 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ]
    }

    fn trains(&self) -> bool {
        self.input_layernorm.weight.requires_grad()
            || self.post_attention_layernorm.weight.requires_grad()
            || self.projections().iter().any(|p| trains(p))
    }

    fn forward(
        &self,
        xs: &Tensor,
        positions: &Positions,
        c: &LlamaConfig,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        let normed = self.input_layernorm.forward(xs, ctx)?;
        let xs = xs + self.self_attn.forward(&normed, positions, c, ctx)?;
        let normed = self.post_attention_layernorm.forward(&xs, ctx)?;
        let m = &self.mlp;
        let gated = m.gate_proj.forward(&normed, ctx)?.silu() * m.up_proj.forward(&normed, ctx)?;
        Ok(xs + m.down_proj.forward(&gated, ctx)?)
    }
}

/// Whether a projection has a trainable weight, bias or adapter.
fn trains(p: &LoraLinear) -> bool {
    p.base.weight.requires_grad()
        || p.base.bias.as_ref().is_some_and(Tensor::requires_grad)
        || p.adapter
            .as_ref()
            .is_some_and(|a| a.a.weight.requires_grad() || a.b.weight.requires_grad())
}

/// x ⊙ cos + rotate_half(x) ⊙ sin, with rotate_half(x) = (-x₂, x₁) for x's halves x₁, x₂
/// (`transformers`' `apply_rotary_pos_emb`).
fn rotate(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = xs.size()[3] / 2;
    let rotated = Tensor::cat(&[-xs.narrow(3, half, half), xs.narrow(3, 0, half)], 3);
    xs * cos + rotated * sin
}

impl Attention {
    fn forward(
        &self,
        xs: &Tensor,
        positions: &Positions,
        c: &LlamaConfig,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        let (heads, kv_heads, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let split = |ys: Tensor, n: i64| ys.view([b, t, n, d]).transpose(1, 2);
        let q = split(self.q_proj.forward(xs, ctx)?, heads);
        let k = split(self.k_proj.forward(xs, ctx)?, kv_heads);
        let v = split(self.v_proj.forward(xs, ctx)?, kv_heads);
        let q = rotate(&q, &positions.cos, &positions.sin);
        let k = rotate(&k, &positions.cos, &positions.sin);
        // Each key/value head serves heads / kv_heads consecutive query heads (`repeat_kv`).
        let groups = heads / kv_heads;
        let repeat = |x: Tensor| {
            x.unsqueeze(2)
                .expand([b, kv_heads, groups, t, d], false)
                .reshape([b, heads, t, d])
        };
        let (k, v) = (repeat(k), repeat(v));
        let dropout = if ctx.train { c.attention_dropout } else { 0.0 };
        let attended = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            Some(&positions.mask),
            dropout,
            false,
            None,
            false,
        )
        .map_err(|e| Error::bad_value("Llama attention input", e.to_string()))?
        .transpose(1, 2)
        .reshape([b, t, heads * d]);
        self.o_proj.forward(&attended, ctx)
    }
}

impl Llama {
    /// The architecture with fresh weights drawn as `transformers` draws them: projections,
    /// embeddings and head from N(0, initializer_range²) (the padding token's embedding row
    /// zero), biases 0, norms 1; LoRA adapters on the projections `lora` targets (its
    /// `target_modules` as given; `hf::lora_for` fills in Llama's defaults). Every weight
    /// trains (`FineTuning::apply` freezes what a mode does not train).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] when `config` is out of range (the field named, as
    /// [`LlamaConfig::from_file`] names it), a classification head has fewer than 1 class, or
    /// `lora`'s settings are (`lora.rank`, ...).
    pub fn new(
        config: LlamaConfig,
        device: Device,
        head: Head,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        config
            .check()
            .map_err(|what| Error::bad_value("LlamaConfig", what))?;
        if let Head::SequenceClassification { classes } = head {
            if classes < 1 {
                return Err(Error::bad_value(
                    "Llama classes",
                    format!("{classes}, expected at least 1"),
                ));
            }
        }
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let c = &config;
        let model = &root / "model";
        let embed_tokens = Embedding::new(&(&model / "embed_tokens"), c.vocab_size, c.hidden_size)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| Block::new(&(&model / "layers" / i), c, lora))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(&(&model / "norm"), c.hidden_size, c.rms_norm_eps)?;
        let sigma = c.initializer_range;
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: sigma,
        };
        let output = match head {
            Head::CausalLm if c.tie_word_embeddings => Linear {
                weight: embed_tokens.weight.shallow_clone(),
                bias: None,
            },
            Head::CausalLm => Linear {
                weight: (&root / "lm_head").var("weight", &[c.vocab_size, c.hidden_size], init),
                bias: None,
            },
            Head::SequenceClassification { classes } => Linear {
                weight: (&root / "score").var("weight", &[classes, c.hidden_size], init),
                bias: None,
            },
        };
        // `transformers`' `_init_weights`: normal projections and embeddings, zero biases (the
        // adapters keep LoRA's own initialisation).
        tch::no_grad(|| {
            let mut table = embed_tokens.weight.shallow_clone();
            let _ = table.normal_(0.0, sigma);
            if let Some(pad) = c.pad_token_id.filter(|&p| (0..c.vocab_size).contains(&p)) {
                let _ = table.get(pad).zero_();
            }
            for block in &layers {
                for projection in block.projections() {
                    let _ = projection.base.weight.shallow_clone().normal_(0.0, sigma);
                    if let Some(bias) = &projection.base.bias {
                        let _ = bias.shallow_clone().zero_();
                    }
                }
            }
        });
        let d = c.head_dim;
        let exponents = Tensor::arange_start_step(0, d, 2, (Kind::Float, device)) / d as f64;
        let inv_freq = Tensor::pow_scalar(c.rope_theta, &exponents).reciprocal();
        Ok(Llama {
            vs,
            config,
            head,
            embed_tokens,
            layers,
            norm,
            output,
            inv_freq,
        })
    }

    /// Reads `dir` (`config.json` and `model.safetensors` or its shards), builds the model with
    /// `fine_tuning`'s LoRA adapters (Llama's default targets, `q_proj` and `v_proj`, when it
    /// names none) and freezes what `fine_tuning` does not train. Every weight the model has
    /// is read and checked, `lm_head.weight` included unless tied to the embeddings; a
    /// classification head is read from `score.weight` where the checkpoint has one and drawn
    /// fresh otherwise; adapters start as LoRA's initialisation.
    ///
    /// # Errors
    ///
    /// The file's errors ([`LlamaConfig::from_file`], `Checkpoint::read`), a missing or
    /// misshapen tensor (named, with the file), and `FineTuning::apply`'s.
    pub fn from_pretrained(
        dir: &Path,
        device: Device,
        head: Head,
        fine_tuning: &FineTuning,
    ) -> Result<Self> {
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let lora = fine_tuning.lora().map(|l| lora_for(Architecture::Llama, l));
        let model = Llama::new(config, device, head, lora.as_ref())?;
        let checkpoint = Checkpoint::read(dir)?;
        for (name, mut var) in model.vs.variables() {
            let fresh_head = name.starts_with("score.") && !checkpoint.contains(&name);
            if is_adapter(&name) || fresh_head {
                continue;
            }
            let value = checkpoint.take(&name, &var.size())?;
            tch::no_grad(|| var.copy_(&value));
        }
        fine_tuning.apply(&model)?;
        Ok(model)
    }

    /// The ids [B, T] and lengths \[B\] of a batch, T from 1 to the position table's rows (sizes
    /// only).
    fn tokens<'a>(&self, features: &'a Features) -> Result<(&'a Tensor, &'a Tensor)> {
        let Features::Tokens { ids, lengths } = features else {
            return Err(wrong_features("Llama", "token sequences", features));
        };
        check_token_shape("Llama", ids, lengths)?;
        let steps = ids.size()[1];
        if steps < 1 || steps > self.config.max_position_embeddings {
            return Err(Error::bad_value(
                "Llama input",
                format!(
                    "sequences of {steps} tokens, expected 1 to the model's {} positions (max_position_embeddings)",
                    self.config.max_position_embeddings
                ),
            ));
        }
        Ok((ids, lengths))
    }

    /// The rotary angles and the attention mask of a batch of `lengths` \[B\] over `steps`
    /// positions, the angles in `kind`.
    fn positions(&self, lengths: &Tensor, steps: i64, kind: Kind) -> Positions {
        let device = self.inv_freq.device();
        let position = Tensor::arange(steps, (Kind::Float, device));
        // Angles in float32 as `LlamaRotaryEmbedding` forms them, then cos and sin in the
        // hidden states' kind.
        let freqs = position.unsqueeze(1) * self.inv_freq.unsqueeze(0);
        let angles = Tensor::cat(&[&freqs, &freqs], 1);
        let steps_range = Tensor::arange(steps, (Kind::Int64, device));
        let causal = steps_range
            .unsqueeze(1)
            .ge_tensor(&steps_range.unsqueeze(0));
        let within = steps_range
            .unsqueeze(0)
            .lt_tensor(&lengths.to_device(device).to_kind(Kind::Int64).unsqueeze(1));
        let batch = lengths.size()[0];
        let mask = causal.unsqueeze(0).logical_and(&within.unsqueeze(1));
        Positions {
            cos: angles.cos().to_kind(kind),
            sin: angles.sin().to_kind(kind),
            mask: mask.view([batch, 1, steps, steps]),
        }
    }

    /// The final norm's output, [B, T, hidden]. The embedding and the blocks before the first
    /// one with a trainable weight run without autograd.
    pub fn hidden_states(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let (ids, lengths) = self.tokens(features)?;
        self.hidden(ids, lengths, None, ctx)
    }

    /// The hidden states after the final norm; `tied`: a language model's tied table on the
    /// tape, which then makes the token lookup.
    fn hidden(
        &self,
        ids: &Tensor,
        lengths: &Tensor,
        tied: Option<&TiedTable>,
        ctx: &mut Ctx,
    ) -> Result<Tensor> {
        let ids = match ids.kind() {
            Kind::Int64 | Kind::Int => ids.shallow_clone(),
            _ => ids.to_kind(Kind::Int64),
        };
        let embedding_trains = self.embed_tokens.weight.requires_grad();
        let frozen = if embedding_trains {
            0
        } else {
            self.layers.iter().take_while(|b| !b.trains()).count()
        };
        let kind = self.embed_tokens.weight.kind();
        let positions = self.positions(lengths, ids.size()[1], kind);
        let c = &self.config;
        let frozen_part = |ctx: &mut Ctx| -> Result<Tensor> {
            let mut xs = match tied {
                Some(table) => table.lookup(&self.embed_tokens.weight, &ids, ctx)?,
                None => self.embed_tokens.forward(&ids, ctx)?,
            };
            for block in &self.layers[..frozen] {
                xs = block.forward(&xs, &positions, c, ctx)?;
            }
            Ok(xs)
        };
        let mut xs = if embedding_trains {
            frozen_part(ctx)?
        } else {
            tch::no_grad(|| frozen_part(ctx))?
        };
        for block in &self.layers[frozen..] {
            xs = block.forward(&xs, &positions, c, ctx)?;
        }
        self.norm.forward(&xs, ctx)
    }
}

impl Model for Llama {
    /// Next-token logits [B, T, vocabulary] (`Head::CausalLm`), or class logits [B, classes]
    /// from each row's last real token (`Head::SequenceClassification`). A language model whose
    /// head is tied to a token table that trains uses the table twice; in a private pass both
    /// uses are recorded and its per-sample gradients are their sum (`nn::tied`).
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let (ids, lengths) = self.tokens(features)?;
        let tied = (self.head == Head::CausalLm
            && self.config.tie_word_embeddings
            && self.embed_tokens.weight.requires_grad()
            && ctx.tape().is_some())
        .then(TiedTable::default);
        let hidden = self.hidden(ids, lengths, tied.as_ref(), ctx)?;
        match self.head {
            Head::CausalLm => match &tied {
                Some(table) => Ok(table.head(&self.embed_tokens.weight, &hidden, ctx)),
                None => self.output.forward(&hidden, ctx),
            },
            Head::SequenceClassification { .. } => {
                let size = hidden.size();
                let last = (lengths.to_device(hidden.device()).to_kind(Kind::Int64) - 1)
                    .clamp_min(0)
                    .view([size[0], 1, 1])
                    .expand([size[0], 1, size[2]], false);
                let pooled = hidden.gather(1, &last, false).squeeze_dim(1);
                self.output.forward(&pooled, ctx)
            }
        }
    }

    /// Token ids within the vocabulary, lengths from 1 to the sequences' length.
    fn check_features(&self, features: &Features) -> Result<()> {
        let (ids, lengths) = self.tokens(features)?;
        check_range("Llama", "token ids", ids, 0, self.config.vocab_size)?;
        check_range("Llama", "lengths", lengths, 1, ids.size()[1] + 1)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// A language model's loss of each sequence: the mean cross-entropy of its next tokens
    /// (`hf::next_token_losses`); a classifier's, the cross-entropy against its label.
    fn example_losses(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_example_losses(self.head == Head::CausalLm, output, features, labels)
    }

    fn mean_loss(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_mean_loss(self.head == Head::CausalLm, output, features, labels)
    }

    /// A language model's accuracy of a sequence is its share of next tokens predicted right.
    fn correct(&self, output: &Tensor, features: &Features, labels: &Tensor) -> Tensor {
        super::head_correct(self.head == Head::CausalLm, output, features, labels)
    }
}

impl Pretrained for Llama {
    fn architecture(&self) -> Architecture {
        Architecture::Llama
    }

    fn block_prefixes(&self) -> Vec<String> {
        (0..self.layers.len())
            .map(|i| format!("model.layers.{i}."))
            .collect()
    }

    fn head_prefixes(&self) -> Vec<String> {
        match self.head {
            Head::SequenceClassification { .. } => vec!["score.".into()],
            Head::CausalLm => Vec::new(),
        }
    }

    fn final_prefixes(&self) -> Vec<String> {
        match self.head {
            Head::SequenceClassification { .. } => vec!["model.norm.".into()],
            Head::CausalLm => vec!["model.norm.".into(), "lm_head.".into()],
        }
    }

    fn projections(&self) -> Vec<&LoraLinear> {
        self.layers.iter().flat_map(|b| b.projections()).collect()
    }

    /// Every weight under its own name (they are Hugging Face's), adapters merged;
    /// `lm_head.weight` left out when tied, as `save_pretrained` leaves it out.
    fn hf_tensors(&self) -> Vec<(String, Tensor)> {
        merged_state(self, |name, t| (name.to_string(), t))
    }

    /// The `config.json` read, with the head's class in `architectures` (and the labels of a
    /// classifier) and `float32` as the weights' kind.
    fn hf_config(&self) -> serde_json::Value {
        let mut config = match self.head {
            Head::CausalLm => {
                let mut config = self.config.raw.clone();
                if let Some(fields) = config.as_object_mut() {
                    fields.insert(
                        "architectures".into(),
                        serde_json::json!(["LlamaForCausalLM"]),
                    );
                }
                config
            }
            Head::SequenceClassification { classes } => {
                classifier_config(&self.config.raw, "LlamaForSequenceClassification", classes)
            }
        };
        if let Some(fields) = config.as_object_mut() {
            fields.insert("model_type".into(), "llama".into());
            fields.remove("num_labels");
            fields.insert("dtype".into(), "float32".into());
            if fields.contains_key("torch_dtype") {
                fields.insert("torch_dtype".into(), "float32".into());
            }
        }
        config
    }
}

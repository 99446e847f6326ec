//! `dpcomp check-device`: the correctness half of the GPU kit, runnable on any device.
//!
//! - **Per-sample gradients** of the four models (Surnames LSTM, CIFAR-10 CNN, ResNet-18 and a
//!   small BERT; the pretrained MiniLM too when its folder is given) against per-example autograd
//!   on the same device, in f64, exactly as `tests/layers/grad_sample.rs` does on the CPU: every
//!   parameter's [B, ...] gradients, and the per-sample norms the clipping uses.
//! - **Compressors** on the device against the same compressor on the CPU, fed the same three
//!   updates: message bits equal, reconstructions and carried state (error feedback, momentum,
//!   PowerSGD's Q) equal to f32 rounding. DGC's sampled threshold draws from each device's own
//!   generator; its selection is exact either way (`compress::topk`), so only an f32 rounding tie
//!   at the k-th element could move one position: the check allows a 0.1% share of positions to
//!   differ and reports the count.
//!
//! The accountant runs on the CPU whatever the device; `scripts/gpu-check.sh` checks its golden
//! value through `dpcomp epsilon`.

use dpcomp::compress::Compressor;
use dpcomp::data::Features;
use dpcomp::error::Result;
use dpcomp::models::{BertClassifier, BertConfig, CifarCnn, Model, ResNet18, SurnamesLstm};
use dpcomp::nn::Ctx;
use dpcomp::privacy::grad_sample::{clip_and_sum, per_sample_gradients};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

/// `dpcomp check-device`: the device checked, an optional pretrained BERT, where to write the
/// report.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CheckDeviceArgs {
    /// The device checked (against per-example autograd on it, and against the CPU).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "auto"))]
    pub device: dpcomp::config::DeviceChoice,
    /// Also check the pretrained BERT in this folder (skipped when the folder has no weights).
    #[cfg_attr(feature = "cli", arg(long))]
    pub bert_dir: Option<PathBuf>,
    /// Write the report here as JSON (it is printed either way).
    #[cfg_attr(feature = "cli", arg(long))]
    pub json_out: Option<PathBuf>,
}

/// One comparison: `error` must be at most `tolerance`.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was compared: `per_sample_gradients/MODEL`, `per_sample_norms/MODEL` or
    /// `compressor/NAME`.
    pub name: String,
    /// The largest relative gap (per-sample checks), or the share of positions that differ
    /// (compressors; infinite when the message bits differ).
    pub error: f64,
    /// The largest `error` that passes.
    pub tolerance: f64,
    /// Whether `error` is at most `tolerance`.
    pub passed: bool,
    /// The comparison in words: sizes, and where the largest gap is or how many positions moved.
    pub detail: String,
}

impl Check {
    fn new(name: impl Into<String>, error: f64, tolerance: f64, detail: String) -> Check {
        Check {
            name: name.into(),
            error,
            tolerance,
            passed: error <= tolerance,
            detail,
        }
    }
}

/// The outcome of `dpcomp check-device`, printed and optionally written as JSON.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The device checked, as LibTorch names it (`Cpu`, `Cuda(0)`).
    pub device: String,
    /// Whether every check passed.
    pub passed: bool,
    /// Every comparison, per-sample checks first, then the compressors.
    pub checks: Vec<Check>,
}

/// Per-sample gradients from one tape agree with per-example autograd to this relative error
/// (f64 on any device; the CPU tests hold 1e-9, a GPU's reduction order costs a little more).
pub const PER_SAMPLE_TOLERANCE: f64 = 1e-8;
/// Device against CPU compressor outputs, relative to the largest magnitude (f32 rounding).
pub const COMPRESSOR_TOLERANCE: f64 = 1e-4;
/// Share of positions allowed to differ beyond that (a rounding tie at the k-th element).
pub const MOVED_POSITIONS_TOLERANCE: f64 = 1e-3;

/// Runs the per-sample gradient checks and the compressor checks on the chosen device and
/// returns their report (printing and writing it is the caller's).
pub fn run(args: &CheckDeviceArgs) -> Result<Report> {
    let device = args.device.device()?;
    let mut checks = per_sample_checks(device, args.bert_dir.as_deref())?;
    checks.extend(compressor_checks(device)?);
    Ok(Report {
        device: format!("{device:?}"),
        passed: checks.iter().all(|c| c.passed),
        checks,
    })
}

fn to_double(model: &dyn Model) {
    for (_, mut p) in model.var_store().variables() {
        tch::no_grad(|| {
            let double = p.to_kind(Kind::Double);
            p.set_data(&double);
        });
    }
}

fn max_abs(t: &Tensor) -> f64 {
    if t.numel() == 0 {
        0.0
    } else {
        dpcomp::host::f64_scalar(&t.abs().max().to_kind(Kind::Double))
    }
}

/// The models and batches of `tests/layers/grad_sample.rs`, built on the CPU from fixed seeds and
/// moved to `device`, so every device checks the same numbers.
fn per_sample_checks(device: Device, bert_dir: Option<&std::path::Path>) -> Result<Vec<Check>> {
    let mut cases: Vec<(&str, Box<dyn Model>, Features, Tensor)> = Vec::new();

    tch::manual_seed(1);
    let ids = Tensor::randint_low(1, 256, [4, 7], (Kind::Int64, Device::Cpu));
    let _ = ids.get(0).narrow(0, 0, 3).fill_(65);
    cases.push((
        "surnames_lstm",
        Box::new(SurnamesLstm::new(device, 18)?),
        Features::Tokens {
            ids,
            lengths: Tensor::from_slice(&[7i64, 2, 5, 7]),
        },
        Tensor::from_slice(&[0i64, 17, 4, 4]),
    ));
    tch::manual_seed(2);
    let model = CifarCnn::new(device, 10)?;
    cases.push((
        "cifar10_cnn",
        Box::new(model),
        Features::Images(Tensor::randn([3, 3, 32, 32], (Kind::Double, Device::Cpu))),
        Tensor::from_slice(&[1i64, 9, 1]),
    ));
    tch::manual_seed(3);
    let model = ResNet18::new(device, 100)?;
    cases.push((
        "cifar100_resnet18",
        Box::new(model),
        Features::Images(Tensor::randn([2, 3, 32, 32], (Kind::Double, Device::Cpu))),
        Tensor::from_slice(&[5i64, 99]),
    ));
    tch::manual_seed(4);
    let config: BertConfig = serde_json::from_str(
        r#"{"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 40, "max_position_embeddings": 20}"#,
    )
    .expect("a valid BERT configuration literal");
    let model = BertClassifier::new(device, config, 3)?;
    cases.push((
        "bert_small",
        Box::new(model),
        Features::TextPair {
            ids: Tensor::randint_low(1, 60, [3, 6], (Kind::Int64, Device::Cpu)),
            token_types: Tensor::from_slice(&[
                0i64, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1,
            ])
            .view([3, 6]),
            attention_mask: Tensor::from_slice(&[
                1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0,
            ])
            .view([3, 6]),
        },
        Tensor::from_slice(&[2i64, 0, 1]),
    ));
    if let Some(dir) = bert_dir.filter(|d| d.join("model.safetensors").exists()) {
        let model = BertClassifier::from_pretrained(dir, device, 3)?;
        cases.push((
            "bert_minilm_pretrained",
            Box::new(model),
            Features::TextPair {
                ids: Tensor::from_slice(&[
                    101i64, 1037, 2158, 102, 1996, 2158, 102, 101, 2048, 2308, 102, 2048, 102, 0,
                ])
                .view([2, 7]),
                token_types: Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0])
                    .view([2, 7]),
                attention_mask: Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
                    .view([2, 7]),
            },
            Tensor::from_slice(&[2i64, 0]),
        ));
    }
    let mut checks = Vec::new();
    for (name, model, features, labels) in cases {
        to_double(model.as_ref());
        let features = match features.to_device(device) {
            Features::Images(x) => Features::Images(x.to_kind(Kind::Double)),
            Features::Rows(x) if x.is_floating_point() => Features::Rows(x.to_kind(Kind::Double)),
            other => other,
        };
        checks.extend(per_sample_gap(
            name,
            model.as_ref(),
            &features,
            &labels.to_device(device),
        )?);
    }
    Ok(checks)
}

/// Per-example autograd, the oracle of every per-sample-gradient check (here and in
/// `tests/layers/grad_sample.rs`): parameter name -> [B, ...] gradients, one example at a time, each
/// example's forward in evaluation mode on the features' device.
pub fn per_example_gradients(
    model: &dyn Model,
    features: &Features,
    labels: &Tensor,
) -> Result<HashMap<String, Tensor>> {
    let params = model.trainable_variables();
    let device = labels.device();
    let mut per_param: HashMap<String, Vec<Tensor>> = HashMap::new();
    for i in 0..labels.size()[0] {
        let index = Tensor::from_slice(&[i]).to_device(device);
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let one = features.select_trimmed(&index, None);
        let logits = model.forward(&one, &mut Ctx::eval())?;
        let loss = model
            .example_losses(&logits, &one, &labels.index_select(0, &index))
            .sum(logits.kind());
        loss.backward();
        for (name, p) in &params {
            let g = p.grad();
            let g = if g.defined() {
                g.copy()
            } else {
                p.zeros_like()
            };
            per_param.entry(name.clone()).or_default().push(g);
        }
    }
    Ok(per_param
        .into_iter()
        .map(|(k, v)| (k, Tensor::stack(&v, 0)))
        .collect())
}

/// Per-example autograd (one example at a time) against one tape and one backward pass.
fn per_sample_gap(
    name: &str,
    model: &dyn Model,
    features: &Features,
    labels: &Tensor,
) -> Result<Vec<Check>> {
    let params = model.trainable_variables();
    let oracle = per_example_gradients(model, features, labels)?;
    let names: HashMap<usize, String> = params
        .iter()
        .map(|(n, p)| (p.data_ptr() as usize, n.clone()))
        .collect();

    let mut ctx = Ctx::private().without_dropout();
    let logits = model.forward(features, &mut ctx)?;
    let losses = model.example_losses(&logits, features, labels);
    let per_sample = per_sample_gradients(
        ctx.take_tape().expect("private context"),
        &losses.sum(Kind::Double),
    )?;
    // Gradients that are zero in exact arithmetic (a bias before a norm) are compared at the
    // model's scale, as in tests/layers/grad_sample.rs.
    let scale = oracle.values().map(max_abs).fold(0.0, f64::max);
    let mut worst = (0.0f64, String::new());
    let mut norms = Vec::new();
    for (param, recipe) in &per_sample {
        let pname = &names[&(param.data_ptr() as usize)];
        let got = recipe.materialize();
        let want = &oracle[pname];
        let gap = max_abs(&(&got - want)) / max_abs(want).max(1e-6 * scale).max(1e-300);
        if gap >= worst.0 {
            worst = (gap, pname.clone());
        }
        norms.push(
            want.square()
                .flatten(1, -1)
                .sum_dim_intlist(1, false, Kind::Double),
        );
    }
    let want_norms = Tensor::stack(&norms, 0)
        .sum_dim_intlist(0, false, Kind::Double)
        .sqrt();
    let got_norms = clip_and_sum(&per_sample, f64::INFINITY).norms;
    let norm_gap = max_abs(&(&got_norms - &want_norms)) / max_abs(&want_norms).max(1e-300);
    Ok(vec![
        Check::new(
            format!("per_sample_gradients/{name}"),
            worst.0,
            PER_SAMPLE_TOLERANCE,
            format!(
                "{} parameters, {} examples; largest gap at {}",
                per_sample.len(),
                labels.size()[0],
                worst.1
            ),
        ),
        Check::new(
            format!("per_sample_norms/{name}"),
            norm_gap,
            PER_SAMPLE_TOLERANCE,
            "clipping's per-example norms (ghost or instantiated) against the oracle's".into(),
        ),
    ])
}

/// The compressors the grids run, at the paper's settings.
fn compressors() -> [(&'static str, Compressor); 4] {
    [
        ("dgc_x16", Compressor::dgc(16.0)),
        ("dgc_x256", Compressor::dgc(256.0)),
        ("denoise_x16", Compressor::denoise(16.0)),
        ("powersgd_rank4", Compressor::powersgd(4)),
    ]
}

/// Positions where `a` and `b` differ by more than `COMPRESSOR_TOLERANCE` of `b`'s largest
/// magnitude, and that largest relative difference.
fn compare(a: &Tensor, b: &Tensor) -> (i64, f64) {
    let scale = max_abs(b).max(1e-30);
    let diff = (a.to_device(Device::Cpu) - b).abs().to_kind(Kind::Double);
    let moved = dpcomp::host::i64_scalar(&diff.gt(COMPRESSOR_TOLERANCE * scale).sum(Kind::Int64));
    (moved, max_abs(&diff) / scale)
}

fn compressor_checks(device: Device) -> Result<Vec<Check>> {
    // The CIFAR-10 CNN's shapes: large enough layers for DGC's sampled threshold.
    let shapes: Vec<Vec<i64>> = CifarCnn::new(Device::Cpu, 10)?
        .trainable_variables()
        .iter()
        .map(|(_, p)| p.size())
        .collect();
    let mut checks = Vec::new();
    for (name, spec) in compressors() {
        let mut on_cpu = spec.link(&shapes, Device::Cpu)?;
        let mut on_device = spec.link(&shapes, device)?;
        let (mut moved, mut total, mut worst_kept, mut bits_equal) = (0i64, 0i64, 0.0f64, true);
        for step in 0..3 {
            tch::manual_seed(100 + step);
            let update: Vec<Tensor> = shapes
                .iter()
                .map(|s| Tensor::randn(s.as_slice(), (Kind::Float, Device::Cpu)))
                .collect();
            let there: Vec<Tensor> = update.iter().map(|t| t.to_device(device)).collect();
            let (m_cpu, r_cpu) = on_cpu.round_trip(&update);
            let (m_dev, r_dev) = on_device.round_trip(&there);
            bits_equal &=
                m_cpu.wire_bits() == m_dev.wire_bits() && m_cpu.paper_bits() == m_dev.paper_bits();
            for (a, b) in r_dev.iter().zip(&r_cpu) {
                let (m, gap) = compare(a, b);
                moved += m;
                total += dpcomp::host::i64_scalar(&b.ne(0.0).sum(Kind::Int64)).max(1);
                if m == 0 {
                    worst_kept = worst_kept.max(gap);
                }
            }
        }
        let state_cpu: HashMap<String, Tensor> = on_cpu.state().into_iter().collect();
        for (key, t) in on_device.state() {
            let (m, gap) = compare(&t, &state_cpu[&key]);
            moved += m;
            total += t.numel() as i64;
            if m == 0 {
                worst_kept = worst_kept.max(gap);
            }
        }
        let share = moved as f64 / total.max(1) as f64;
        checks.push(Check::new(
            format!("compressor/{name}"),
            if bits_equal { share } else { f64::INFINITY },
            MOVED_POSITIONS_TOLERANCE,
            format!(
                "3 steps on the CIFAR-10 CNN's shapes: message bits {}; {moved} of {total} compared positions differ by more than {COMPRESSOR_TOLERANCE:e} of the largest magnitude; elsewhere at most {worst_kept:.2e}",
                if bits_equal { "equal" } else { "DIFFER" }
            ),
        ));
    }
    Ok(checks)
}

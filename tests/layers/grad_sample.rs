//! Oracle tests for per-sample gradients: for every layer type and each of the four models, in
//! f64, the per-sample gradients from one tape + one backward pass equal per-example autograd
//! (one example at a time); ghost norms equal instantiated norms; clipped per-sample norms are
//! at most C; the clipped sum equals Σ c_i g_i formed from the oracle's gradients.

use crate::common;
use dpcomp::data::Features;
use dpcomp::models::{BertClassifier, BertConfig, CifarCnn, Model, ResNet18, SurnamesLstm};
use dpcomp::nn::Ctx;
use dpcomp::privacy::engine::Clipping;
use dpcomp::privacy::grad_sample::{
    clip_and_sum, clipped_sums, patches, per_sample_gradients, per_sample_to_every_output,
    pixel_grams, tape_runs_in_autograd, Activations, BackwardPasses, PerSample,
};
use dpcomp_lab::bench::device_check::per_example_gradients;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// Per-example autograd: parameter name -> [B, ...] gradients, one example at a time (the
/// library's oracle, which `dpcomp check-device` runs on any device).
fn oracle(model: &dyn Model, features: &Features, labels: &Tensor) -> HashMap<String, Tensor> {
    per_example_gradients(model, features, labels).unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

/// Like `max_rel_diff`, but gradients that are zero in exact arithmetic (a convolution bias
/// before InstanceNorm, the attention key bias) are compared at the model's gradient scale.
fn max_diff_at_scale(a: &Tensor, b: &Tensor, model_scale: f64) -> f64 {
    let scale = b
        .abs()
        .max()
        .double_value(&[])
        .max(1e-6 * model_scale)
        .max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

/// Runs every check on one model and batch; returns whether every layer ran in autograd (the
/// recipes formed by gradient hooks inside the backward pass).
fn check(model: &dyn Model, features: Features, labels: Tensor, max_norm: f64) -> bool {
    let expected = oracle(model, &features, &labels);
    let names: HashMap<usize, String> = model
        .trainable_variables()
        .into_iter()
        .map(|(n, p)| (p.data_ptr() as usize, n))
        .collect();

    // The recipes formed inside the backward pass by gradient hooks (wherever every layer runs
    // in autograd) and those from every recorded output's gradient at once are the same values.
    let recipes = |every_output: bool| {
        let mut ctx = Ctx::private().without_dropout();
        let logits = model.forward(&features, &mut ctx).unwrap();
        let losses = model.example_losses(&logits, &features, &labels);
        let tape = ctx.take_tape().unwrap();
        let loss_sum = losses.sum(Kind::Double);
        if every_output {
            per_sample_to_every_output(tape, &loss_sum).unwrap()
        } else {
            per_sample_gradients(tape, &loss_sum).unwrap()
        }
    };
    let per_sample = recipes(false);
    let at_once: HashMap<usize, Tensor> = recipes(true)
        .into_iter()
        .map(|(p, r)| (p.data_ptr() as usize, r.materialize()))
        .collect();
    assert_eq!(at_once.len(), per_sample.len());
    for (param, recipe) in &per_sample {
        let name = &names[&(param.data_ptr() as usize)];
        let diff = max_rel_diff(
            &recipe.materialize(),
            &at_once[&(param.data_ptr() as usize)],
        );
        assert!(
            diff < 1e-12,
            "{name}: hooks and every-output recipes differ by {diff:e}"
        );
    }

    // Every trainable parameter has exactly one recipe.
    assert_eq!(per_sample.len(), names.len(), "parameters on the tape");
    let model_scale = expected
        .values()
        .map(|g| g.abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    let mut materialized = Vec::new();
    for (param, recipe) in &per_sample {
        let name = &names[&(param.data_ptr() as usize)];
        let got = recipe.materialize();
        let want = &expected[name];
        assert_eq!(got.size(), want.size(), "{name}");
        let diff = max_diff_at_scale(&got, want, model_scale);
        assert!(
            diff < 1e-9,
            "{name}: per-sample gradients differ from per-example autograd by {diff:e}"
        );
        // Ghost (or instantiated) norms equal the norms of the materialised gradients.
        let direct = got
            .square()
            .flatten(1, -1)
            .sum_dim_intlist(1, false, Kind::Double);
        let diff = max_diff_at_scale(&recipe.squared_norms(), &direct, model_scale * model_scale);
        assert!(diff < 1e-9, "{name}: squared norms differ by {diff:e}");
        materialized.push(got);
    }

    let clipped = clip_and_sum(&per_sample, max_norm);
    let total = Tensor::stack(
        &materialized
            .iter()
            .map(|g| {
                g.square()
                    .flatten(1, -1)
                    .sum_dim_intlist(1, false, Kind::Double)
            })
            .collect::<Vec<_>>(),
        0,
    )
    .sum_dim_intlist(0, false, Kind::Double)
    .sqrt();
    assert!(max_rel_diff(&clipped.norms, &total) < 1e-9);
    // At least one example is clipped and one is not, so both branches are exercised.
    let clipped_any = total.gt(max_norm).any().int64_value(&[]) == 1;
    assert!(clipped_any, "choose C below some norm: norms {total}");
    // The factors are Opacus's min(1, C / (norm + 1e-6)), computed here from the oracle's norms
    // in plain f64: examples within C are left exactly as they are, the others scaled to C.
    let norms = Vec::<f64>::try_from(&total).unwrap();
    let factors = Vec::<f64>::try_from(&clipped.factors.to_kind(Kind::Double)).unwrap();
    assert_eq!(factors.len(), norms.len());
    for (norm, factor) in norms.iter().zip(&factors) {
        let want = (max_norm / (norm + 1e-6)).min(1.0);
        assert!(
            (factor - want).abs() <= 1e-9 * want,
            "norm {norm}: factor {factor}, want {want}"
        );
    }
    assert!(
        factors.contains(&1.0) && factors.iter().any(|&f| f < 1.0),
        "choose C between the norms: {norms:?}"
    );
    // Clipped per-sample norms are at most C.
    let clipped_norms = &total * &clipped.factors;
    assert!(
        clipped_norms.max().double_value(&[]) <= max_norm * (1.0 + 1e-9),
        "{clipped_norms}"
    );
    // The training step's clipped sums (`clipped_sums`: recipes and norms formed inside one
    // backward pass, or two passes with the norms taken inside the first, wherever every layer
    // runs in autograd) equal the oracle's too.
    let by_name: HashMap<usize, &Tensor> = clipped
        .grads
        .iter()
        .map(|(p, sum)| (p.data_ptr() as usize, sum))
        .collect();
    let mut in_autograd = false;
    for passes in [BackwardPasses::One, BackwardPasses::Two] {
        let mut ctx = Ctx::private().without_dropout();
        let logits = model.forward(&features, &mut ctx).unwrap();
        let losses = model.example_losses(&logits, &features, &labels);
        in_autograd = tape_runs_in_autograd(ctx.tape().unwrap());
        let params = model.trainable_variables();
        let clipping = Clipping::Flat { max_norm };
        let step = clipped_sums(&mut ctx, &params, &losses, &clipping, passes).unwrap();
        let how = format!("{passes:?} (every layer in autograd: {in_autograd})");
        assert!(max_rel_diff(&step.norms, &total) < 1e-9, "{how}: norms");
        assert_eq!(
            step.clipped.int64_value(&[]),
            total.gt(max_norm).sum(Kind::Int64).int64_value(&[]),
            "{how}: clipped count"
        );
        for ((name, param), sum) in params.iter().zip(&step.sums) {
            let diff = max_diff_at_scale(sum, by_name[&(param.data_ptr() as usize)], model_scale);
            assert!(
                diff < 1e-9,
                "{name}: the step's clipped sum ({how}) differs by {diff:e}"
            );
        }
    }
    for ((param, sum), g) in clipped.grads.iter().zip(&materialized) {
        let mut shape = vec![1i64; g.dim()];
        shape[0] = -1;
        let want =
            (g * clipped.factors.view(shape.as_slice())).sum_dim_intlist(0, false, Kind::Double);
        let diff = max_diff_at_scale(sum, &want, model_scale);
        assert!(
            diff < 1e-9,
            "{}: clipped sum differs by {diff:e}",
            names[&(param.data_ptr() as usize)]
        );
    }
    in_autograd
}

/// C between the smallest and largest per-sample norm.
fn median_norm_guess(model: &dyn Model, features: &Features, labels: &Tensor) -> f64 {
    let mut ctx = Ctx::private().without_dropout();
    let logits = model.forward(features, &mut ctx).unwrap();
    let losses = model.example_losses(&logits, features, labels);
    let per_sample =
        per_sample_gradients(ctx.take_tape().unwrap(), &losses.sum(Kind::Double)).unwrap();
    let norms = clip_and_sum(&per_sample, f64::INFINITY).norms;
    let (lo, hi) = (norms.min().double_value(&[]), norms.max().double_value(&[]));
    for (_, p) in model.trainable_variables() {
        p.shallow_clone().zero_grad();
    }
    0.5 * (lo + hi)
}

/// Every check of `check` at a clipping radius between the smallest and largest per-sample norm
/// (the Hugging Face models' tests use it too).
pub(crate) fn run(model: &dyn Model, features: Features, labels: Tensor) -> bool {
    let c = median_norm_guess(model, &features, &labels);
    check(model, features, labels, c)
}

#[test]
fn surnames_lstm_embedding_and_linear() {
    let _serial = common::serial();
    tch::manual_seed(1);
    let model = SurnamesLstm::new(Device::Cpu, 18).unwrap();
    common::to_double(model.var_store());
    let ids = Tensor::randint_low(1, 256, [4, 7], (Kind::Int64, Device::Cpu));
    // Repeated ids inside one name exercise the embedding's ghost norm.
    let _ = ids.get(0).narrow(0, 0, 3).fill_(65);
    let lengths = Tensor::from_slice(&[7i64, 2, 5, 7]);
    let two_passes = run(
        &model,
        Features::Tokens { ids, lengths },
        Tensor::from_slice(&[0i64, 17, 4, 4]),
    );
    assert!(!two_passes, "the LSTM runs outside autograd: one pass");
}

#[test]
fn cifar_cnn_conv_instance_norm_and_linear() {
    let _serial = common::serial();
    tch::manual_seed(2);
    let model = CifarCnn::new(Device::Cpu, 10).unwrap();
    common::to_double(model.var_store());
    let xs = Tensor::randn([3, 3, 32, 32], (Kind::Double, Device::Cpu));
    assert!(run(
        &model,
        Features::Images(xs),
        Tensor::from_slice(&[1i64, 9, 1]),
    ));
}

#[test]
fn resnet18_group_norm_and_strided_convolutions() {
    let _serial = common::serial();
    tch::manual_seed(3);
    let model = ResNet18::new(Device::Cpu, 100).unwrap();
    common::to_double(model.var_store());
    let xs = Tensor::randn([2, 3, 32, 32], (Kind::Double, Device::Cpu));
    assert!(run(
        &model,
        Features::Images(xs),
        Tensor::from_slice(&[5i64, 99]),
    ));
}

#[test]
fn bert_last_layer_sequence_linear_layer_norm_pooler() {
    let _serial = common::serial();
    tch::manual_seed(4);
    let config: BertConfig = serde_json::from_str(
        r#"{"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 40, "max_position_embeddings": 20}"#,
    )
    .unwrap();
    let model = BertClassifier::new(Device::Cpu, config, 3).unwrap();
    common::to_double(model.var_store());
    let ids = Tensor::randint_low(1, 60, [3, 6], (Kind::Int64, Device::Cpu));
    let token_types =
        Tensor::from_slice(&[0i64, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1]).view([3, 6]);
    let attention_mask =
        Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0]).view([3, 6]);
    assert!(run(
        &model,
        Features::TextPair {
            ids,
            token_types,
            attention_mask,
        },
        Tensor::from_slice(&[2i64, 0, 1]),
    ));
}

#[test]
fn bert_minilm_pretrained() {
    let _serial = common::serial();
    let model = BertClassifier::from_pretrained(&common::bert_dir(), Device::Cpu, 3).unwrap();
    common::to_double(model.var_store());
    let ids = Tensor::from_slice(&[
        101i64, 1037, 2158, 102, 1996, 2158, 102, 101, 2048, 2308, 102, 2048, 102, 0,
    ])
    .view([2, 7]);
    let token_types =
        Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0]).view([2, 7]);
    let attention_mask =
        Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]).view([2, 7]);
    run(
        &model,
        Features::TextPair {
            ids,
            token_types,
            attention_mask,
        },
        Tensor::from_slice(&[2i64, 0]),
    );
}

#[test]
fn ghost_and_instantiated_norms_agree_on_both_sides_of_the_cost_rule() {
    let _serial = common::serial();
    use dpcomp::privacy::grad_sample::ghost_is_cheaper;
    tch::manual_seed(5);
    for (steps, input, output) in [(1, 7, 5), (3, 40, 30), (50, 4, 6)] {
        let a = Tensor::randn([4, steps, input], (Kind::Double, Device::Cpu));
        let b = Tensor::randn([4, steps, output], (Kind::Double, Device::Cpu));
        let c = Tensor::rand([4], (Kind::Double, Device::Cpu));
        // Both ways of taking the norm, and the contraction for the clipped sum, on each shape.
        for ghost in [true, false] {
            let recipe = PerSample::Outer {
                a: Activations::Held(a.shallow_clone()),
                b: b.shallow_clone(),
                shape: vec![output, input],
                ghost,
            };
            let full = recipe.materialize();
            let direct = full
                .square()
                .flatten(1, -1)
                .sum_dim_intlist(1, false, Kind::Double);
            assert!(
                max_rel_diff(&recipe.squared_norms(), &direct) < 1e-12,
                "T={steps} ghost={ghost}"
            );
            let want = (&full * c.view([-1, 1, 1])).sum_dim_intlist(0, false, Kind::Double);
            assert!(max_rel_diff(&recipe.weighted_sum(&c), &want) < 1e-12);
        }
    }
    assert!(ghost_is_cheaper(4, 3, 40, 30) && !ghost_is_cheaper(4, 50, 4, 6));
    assert!(ghost_is_cheaper(1 << 20, 50, 4096, 4096), "memory guard");
    // Against a gradient too large to keep, the ghost norm only has to beat forming it: GPT-2's
    // attention projection at 128 tokens (128² · 3072 = 50M against (128 + 16) · 768 · 2304 =
    // 255M an example), though not against a kept one (24 · 768 · 2304 = 42M); a 3x3
    // convolution's 225 positions still instantiate.
    use dpcomp::privacy::grad_sample::ghost_is_cheaper_than_dropped;
    assert!(
        ghost_is_cheaper_than_dropped(8, 128, 768, 2304) && !ghost_is_cheaper(8, 128, 768, 2304)
    );
    assert!(!ghost_is_cheaper_than_dropped(64, 225, 288, 64));
}

#[test]
fn patches_equal_libtorch_im2col() {
    // It reseeds LibTorch's global generator: not while another test of this file draws from it.
    let _serial = common::serial();
    tch::manual_seed(7);
    for (channels, size, kernel, stride, padding) in [
        (3, 32, 3, 1, 1),
        (64, 8, 3, 2, 1),
        (64, 8, 1, 2, 0),
        (5, 7, 3, 2, 0),
        (2, 9, 5, 1, 2),
    ] {
        let x = Tensor::randn([4, channels, size, size], (Kind::Double, Device::Cpu));
        let ours = patches(&x, kernel, stride, padding);
        let theirs = x.im2col(
            [kernel, kernel],
            [1, 1],
            [padding, padding],
            [stride, stride],
        );
        assert_eq!(
            ours.size(),
            theirs.size(),
            "shape for {channels}x{size} k{kernel} s{stride} p{padding}"
        );
        assert_eq!(
            (ours - theirs).abs().max().double_value(&[]),
            0.0,
            "values for {channels}x{size} k{kernel} s{stride} p{padding}"
        );
    }
}

/// The ghost norm's patch Grams from the input's pixel Gram equal the patches' own product, for
/// stride 1 and 2, padding, odd sizes and a 1x1 kernel, and for an empty batch.
#[test]
fn pixel_grams_equal_the_patches_product() {
    let _serial = common::serial();
    tch::manual_seed(8);
    for (batch, channels, size, kernel, stride, padding) in [
        (3, 64, 6, 3, 1, 0),
        (2, 16, 8, 3, 1, 1),
        (2, 8, 8, 3, 2, 1),
        (2, 8, 7, 1, 2, 0),
        (2, 4, 9, 5, 1, 2),
        (0, 4, 6, 3, 1, 1),
    ] {
        let x = Tensor::randn([batch, channels, size, size], (Kind::Double, Device::Cpu));
        let p = patches(&x, kernel, stride, padding).transpose(1, 2);
        let want = p.bmm(&p.transpose(1, 2));
        let got = pixel_grams(&x, kernel, stride, padding);
        let what = format!("{batch}x{channels}x{size} k{kernel} s{stride} p{padding}");
        assert_eq!(got.size(), want.size(), "shape for {what}");
        if batch > 0 {
            assert!(max_rel_diff(&got, &want) < 1e-12, "values for {what}");
        }
    }
}

/// An empty Poisson batch through one or two passes: zero sums, nothing clipped, no norms.
#[test]
fn an_empty_batch_gives_zero_sums() {
    let _serial = common::serial();
    tch::manual_seed(6);
    let model = CifarCnn::new(Device::Cpu, 10).unwrap();
    for passes in [BackwardPasses::One, BackwardPasses::Two] {
        let mut ctx = Ctx::private().without_dropout();
        let features = Features::Images(Tensor::zeros([0, 3, 32, 32], (Kind::Float, Device::Cpu)));
        let logits = model.forward(&features, &mut ctx).unwrap();
        let labels = Tensor::zeros([0], (Kind::Int64, Device::Cpu));
        let losses = model.example_losses(&logits, &features, &labels);
        assert!(tape_runs_in_autograd(ctx.tape().unwrap()));
        let params = model.trainable_variables();
        let step = clipped_sums(
            &mut ctx,
            &params,
            &losses,
            &Clipping::Flat { max_norm: 1.0 },
            passes,
        )
        .unwrap();
        assert_eq!(step.norms.size(), vec![0]);
        assert_eq!(step.clipped.int64_value(&[]), 0);
        for ((name, p), sum) in params.iter().zip(&step.sums) {
            assert_eq!(sum.size(), p.size(), "{name}");
            assert_eq!(sum.abs().max().double_value(&[]), 0.0, "{name}");
        }
    }
}

/// A group norm under a private context runs LibTorch's group-norm kernel directly, for its
/// statistics: its output is the non-private forward's, bit for bit, and its per-sample affine
/// gradients, formed from those statistics without x̂, equal Σ x̂ b over each channel's
/// positions (f32, a 3-D and a 4-D input, groups of one and several channels).
#[test]
fn group_norm_per_sample_gradients_from_its_statistics() {
    use dpcomp::nn::GroupNorm;
    let _serial = common::serial();
    tch::manual_seed(9);
    for (shape, groups) in [
        (vec![3i64, 8, 5, 4], 2i64),
        (vec![4, 6, 7], 6),
        (vec![2, 4, 3, 3], 1),
    ] {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let channels = shape[1];
        let mut norm = GroupNorm::new(&vs.root(), groups, channels).unwrap();
        tch::no_grad(|| {
            norm.weight
                .copy_(&(Tensor::rand([channels], (Kind::Float, Device::Cpu)) + 0.5));
            norm.bias
                .copy_(&Tensor::randn([channels], (Kind::Float, Device::Cpu)));
        });
        let x = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 3.0 + 1.5;
        let plain = norm.forward(&x, &mut Ctx::eval()).unwrap();
        let mut ctx = Ctx::private();
        let y = norm.forward(&x, &mut ctx).unwrap();
        assert!(y.equal(&plain), "private forward differs, shape {shape:?}");
        let b = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu));
        let loss = (&y * &b).sum(Kind::Float);
        let recipes = per_sample_gradients(ctx.take_tape().unwrap(), &loss).unwrap();
        let x_hat = x.group_norm(groups, None::<&Tensor>, None::<&Tensor>, 1e-5, false);
        let dims: Vec<i64> = (2..shape.len() as i64).collect();
        let want_w = (&x_hat * &b).sum_dim_intlist(dims.as_slice(), false, Kind::Float);
        let want_b = b.sum_dim_intlist(dims.as_slice(), false, Kind::Float);
        for (parameter, recipe) in &recipes {
            let got = recipe.materialize();
            let want = if parameter.data_ptr() == norm.weight.data_ptr() {
                &want_w
            } else {
                &want_b
            };
            assert!(
                (&got - want).abs().max().double_value(&[]) < 2e-4,
                "shape {shape:?}: {got} against {want}"
            );
        }
        assert_eq!(recipes.len(), 2);
    }
}

/// A convolution's instantiated per-sample gradients equal b_iᵀ P_i from its cut patches, both
/// where they come from a grouped convolution backward (16 or more input channels, stride 1) and
/// where from the patches (stride 2, a 1x1 stride-2 shortcut, 3 channels), in f64.
#[test]
fn instantiated_convolution_gradients_equal_the_patches_product() {
    use dpcomp::privacy::grad_sample::outer;
    let _serial = common::serial();
    tch::manual_seed(10);
    for (channels, out, size, kernel, stride, padding) in [
        (16, 8, 9, 3, 2, 1),
        (16, 8, 10, 3, 2, 0),
        (16, 8, 8, 3, 1, 1),
        (16, 8, 9, 1, 2, 0),
        (3, 8, 9, 3, 2, 1),
    ] {
        let batch = 3;
        let x = Tensor::randn([batch, channels, size, size], (Kind::Double, Device::Cpu));
        let p = patches(&x, kernel, stride, padding);
        let steps = p.size()[2];
        let b = Tensor::randn([batch, steps, out], (Kind::Double, Device::Cpu));
        let want = b
            .transpose(1, 2)
            .bmm(&p.transpose(1, 2))
            .view([batch, out, channels, kernel, kernel]);
        let a = Activations::Patches {
            input: x.shallow_clone(),
            kernel,
            stride,
            padding,
        };
        let recipe = outer(a, b.shallow_clone(), vec![out, channels, kernel, kernel]);
        let what = format!("{channels}->{out} at {size}, k{kernel} s{stride} p{padding}");
        assert!(
            matches!(recipe, PerSample::Parts(_)),
            "{what}: instantiated"
        );
        assert!(max_rel_diff(&recipe.materialize(), &want) < 1e-12, "{what}");
    }
}

/// Instance norm runs as group norm with one channel a group: its output equals LibTorch's
/// `instance_norm` up to rounding, with and without an affine map, and the affine map's
/// per-sample gradients (from the forward statistics) equal Σ x̂ b over each channel's positions.
#[test]
fn instance_norm_equals_libtorchs_and_its_per_sample_gradients_are_exact() {
    use dpcomp::nn::InstanceNorm2d;
    let _serial = common::serial();
    tch::manual_seed(11);
    let x = Tensor::randn([3, 4, 5, 6], (Kind::Float, Device::Cpu)) * 2.0 - 0.7;
    let want = x.instance_norm(
        None::<&Tensor>,
        None::<&Tensor>,
        None::<&Tensor>,
        None::<&Tensor>,
        true,
        0.1,
        1e-5,
        false,
    );
    let plain = InstanceNorm2d::plain()
        .forward(&x, &mut Ctx::eval())
        .unwrap();
    assert!((&plain - &want).abs().max().double_value(&[]) < 1e-5);
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let mut norm = InstanceNorm2d::new(&vs.root(), 4).unwrap();
    let (weight, bias) = norm.affine.as_mut().unwrap();
    tch::no_grad(|| {
        weight.copy_(&Tensor::from_slice(&[0.5f32, 1.5, -1.0, 2.0]));
        bias.copy_(&Tensor::from_slice(&[0.1f32, -0.2, 0.3, 0.0]));
    });
    let mut ctx = Ctx::private();
    let y = norm.forward(&x, &mut ctx).unwrap();
    let (weight, _) = norm.affine.as_ref().unwrap();
    let affine_want = &want * weight.view([1, 4, 1, 1])
        + Tensor::from_slice(&[0.1f32, -0.2, 0.3, 0.0]).view([1, 4, 1, 1]);
    assert!((&y - &affine_want).abs().max().double_value(&[]) < 1e-5);
    let b = Tensor::randn([3, 4, 5, 6], (Kind::Float, Device::Cpu));
    let loss = (&y * &b).sum(Kind::Float);
    let recipes = per_sample_gradients(ctx.take_tape().unwrap(), &loss).unwrap();
    let want_w = (&want * &b).sum_dim_intlist([2i64, 3].as_slice(), false, Kind::Float);
    let want_b = b.sum_dim_intlist([2i64, 3].as_slice(), false, Kind::Float);
    assert_eq!(recipes.len(), 2);
    for (parameter, recipe) in &recipes {
        let expected = if parameter.data_ptr() == weight.data_ptr() {
            &want_w
        } else {
            &want_b
        };
        assert!(
            (&recipe.materialize() - expected)
                .abs()
                .max()
                .double_value(&[])
                < 2e-4
        );
    }
}

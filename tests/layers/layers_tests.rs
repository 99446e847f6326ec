//! The GRU and the multi-head attention layer (issue 16): the GRU's forward pass equals
//! PyTorch's fused GRU, its hand-written backpropagation through time equals autograd, and in
//! small models with a linear layer before and after them both give per-sample gradients, norms
//! and clipped sums equal to per-example autograd (f64). The tests seed LibTorch's global
//! generator, so they run one at a time (`common::serial`).

use crate::common;
use dpcomp::data::{Batch, Features};
use dpcomp::models::Model;
use dpcomp::nn::{AttentionConfig, Ctx, Gru, Linear, LinearConfig, MultiheadAttention};
use dpcomp::privacy::grad_sample::clip_and_sum;
use dpcomp::train::private::{per_sample_in_order, PerSampleBatch};
use dpcomp_lab::bench::device_check::per_example_gradients;
use tch::{nn, Device, Kind, Reduction, Tensor};

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

/// Linear -> GRU -> the state at the last step -> Linear; rows are `Features::Rows` [B, T, 5].
struct GruNet {
    vs: nn::VarStore,
    first: Linear,
    gru: Gru,
    last: Linear,
}

impl GruNet {
    fn new(seed: i64) -> Self {
        tch::manual_seed(seed);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let (first, gru, last) = (
            Linear::new(&(&root / "first"), 5, 6, LinearConfig::default()).unwrap(),
            Gru::new(&(&root / "gru"), 6, 7).unwrap(),
            Linear::new(&(&root / "last"), 7, 3, LinearConfig::default()).unwrap(),
        );
        vs.double();
        GruNet {
            vs,
            first,
            gru,
            last,
        }
    }
}

impl Model for GruNet {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Rows(xs) = features else {
            panic!("sequences of rows expected");
        };
        let hs = self
            .gru
            .forward(&self.first.forward(xs, ctx)?.tanh(), ctx)?;
        let steps = hs.size()[1];
        self.last.forward(&hs.select(1, steps - 1), ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

/// Linear -> self-attention with a padding mask -> mean over positions -> Linear.
struct AttentionNet {
    vs: nn::VarStore,
    first: Linear,
    attention: MultiheadAttention,
    last: Linear,
    mask: Tensor,
}

impl AttentionNet {
    fn new(seed: i64, mask: Tensor) -> Self {
        tch::manual_seed(seed);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let first = Linear::new(&(&root / "first"), 5, 8, LinearConfig::default()).unwrap();
        let config = AttentionConfig {
            heads: 2,
            dropout: 0.0,
        };
        let attention = MultiheadAttention::new(&(&root / "attention"), 8, config).unwrap();
        let last = Linear::new(&(&root / "last"), 8, 3, LinearConfig::default()).unwrap();
        vs.double();
        AttentionNet {
            vs,
            first,
            attention,
            last,
            mask,
        }
    }
}

impl Model for AttentionNet {
    /// The mask is per example: the rows given are looked up by their first feature, which the
    /// batch sets to the example's index (so the per-example oracle sees the same mask row).
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> dpcomp::error::Result<Tensor> {
        let Features::Rows(xs) = features else {
            panic!("sequences of rows expected");
        };
        let index = xs.select(2, 0).select(1, 0).to_kind(Kind::Int64);
        let mask = self
            .mask
            .index_select(0, &index)
            .view([-1, 1, 1, xs.size()[1]]);
        let hs = self.first.forward(xs, ctx)?;
        let attended = self.attention.forward(&hs, Some(&mask), ctx)?;
        self.last
            .forward(&attended.mean_dim(1, false, Kind::Double), ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}

/// Per-sample gradients, norms and a clipped sum that clips some examples, against the oracle.
fn check_against_per_example_autograd(net: &dyn Model, batch: &Batch) {
    let params = net.trainable_variables();
    let expected = per_example_gradients(net, &batch.features, &batch.labels).unwrap();
    let PerSampleBatch { per_sample, .. } =
        per_sample_in_order(net, &params, batch, false).unwrap();
    for ((name, _), (_, recipe)) in params.iter().zip(&per_sample) {
        let (got, want) = (recipe.materialize(), &expected[name]);
        assert_eq!(got.size(), want.size(), "{name}");
        if name.ends_with("key.bias") {
            // q·b_k is the same for every key of a query, and softmax ignores a shift: the
            // key bias gets no gradient at all, in the oracle and (to rounding) in ours.
            assert!(got.abs().max().double_value(&[]) < 1e-12, "{name}");
            continue;
        }
        assert!(
            want.abs().max().double_value(&[]) > 1e-8,
            "{name}: the oracle has no gradient"
        );
        let diff = max_rel_diff(&got, want);
        assert!(diff < 1e-10, "{name}: relative difference {diff}");
    }
    let squares: Vec<Tensor> = params
        .iter()
        .map(|(name, _)| {
            expected[name]
                .flatten(1, -1)
                .square()
                .sum_dim_intlist(1, false, Kind::Double)
        })
        .collect();
    let norms = Tensor::stack(&squares, 0)
        .sum_dim_intlist(0, false, Kind::Double)
        .sqrt();
    let max_norm = norms.median().double_value(&[]);
    let clipped = clip_and_sum(&per_sample, max_norm);
    assert!(max_rel_diff(&clipped.norms, &norms) < 1e-10);
    let factors = (max_norm / (&norms + 1e-6)).clamp_max(1.0);
    let batch_size = norms.size()[0];
    let n_clipped = factors.lt(1.0).sum(Kind::Int64).int64_value(&[]);
    assert!(
        n_clipped > 0 && n_clipped < batch_size,
        "{n_clipped} clipped"
    );
    for ((name, _), (_, sum)) in params.iter().zip(&clipped.grads) {
        let g = &expected[name];
        let mut shape = vec![-1i64];
        shape.extend(std::iter::repeat_n(1, g.dim() - 1));
        let want = (g * factors.view(shape.as_slice())).sum_dim_intlist(0, false, Kind::Double);
        if name.ends_with("key.bias") {
            // Zero up to rounding on both sides (above): compare absolutely.
            assert!(
                (sum - &want).abs().max().double_value(&[]) < 1e-12,
                "{name}"
            );
            continue;
        }
        assert!(max_rel_diff(sum, &want) < 1e-10, "{name}: clipped sum");
    }
}

#[test]
fn gru_forward_equals_pytorchs_gru() {
    // LibTorch\'s generator is global: tests that seed it run one at a time.
    let _serial = common::serial();
    let net = GruNet::new(1);
    let xs = Tensor::randn([4, 9, 6], (Kind::Double, Device::Cpu));
    let ours = net.gru.forward(&xs, &mut Ctx::eval()).unwrap();
    let g = &net.gru;
    let h0 = Tensor::zeros([1, 4, 7], (Kind::Double, Device::Cpu));
    let (theirs, last) = xs.gru(
        &h0,
        &[&g.w_ih, &g.w_hh, &g.b_ih, &g.b_hh],
        true,
        1,
        0.0,
        false,
        false,
        true,
    );
    assert_eq!(ours.size(), theirs.size());
    assert!(max_rel_diff(&ours, &theirs) < 1e-12);
    assert!(max_rel_diff(&ours.select(1, 8), &last.squeeze_dim(0)) < 1e-12);
    // The cached forward pass (training) gives the same states.
    let (cached, _) = tch::no_grad(|| g.forward_cached(&xs));
    assert!(max_rel_diff(&cached, &theirs) < 1e-12);
}

#[test]
fn gru_hand_written_backward_equals_autograd() {
    // LibTorch\'s generator is global: tests that seed it run one at a time.
    let _serial = common::serial();
    let net = GruNet::new(2);
    let xs = Tensor::randn([5, 6, 5], (Kind::Double, Device::Cpu));
    let labels = Tensor::from_slice(&[0i64, 2, 1, 1, 2]);
    let features = Features::Rows(xs);
    let grads = |ctx: &mut Ctx| {
        for (_, p) in net.trainable_variables() {
            p.shallow_clone().zero_grad();
        }
        let loss = net
            .forward(&features, ctx)
            .unwrap()
            .cross_entropy_loss::<Tensor>(&labels, None, Reduction::Mean, -100, 0.0);
        ctx.backward(&loss);
        net.trainable_variables()
            .into_iter()
            .map(|(n, p)| (n, p.grad().copy()))
            .collect::<Vec<_>>()
    };
    let expected = grads(&mut Ctx::eval());
    let got = grads(&mut Ctx::train());
    assert_eq!(expected.len(), 8);
    for ((name, e), (_, g)) in expected.iter().zip(&got) {
        assert!(
            e.abs().max().double_value(&[]) > 1e-8,
            "{name}: no gradient"
        );
        let diff = max_rel_diff(g, e);
        // `first.*` checks the gradient the GRU hands back to the layer before it.
        assert!(diff < 1e-10, "{name}: relative difference {diff}");
    }
}

#[test]
fn gru_per_sample_gradients_equal_per_example_autograd() {
    // LibTorch\'s generator is global: tests that seed it run one at a time.
    let _serial = common::serial();
    let net = GruNet::new(3);
    tch::manual_seed(30);
    let batch = Batch {
        features: Features::Rows(Tensor::randn([6, 5, 5], (Kind::Double, Device::Cpu))),
        labels: Tensor::from_slice(&[0i64, 2, 1, 1, 0, 2]),
    };
    check_against_per_example_autograd(&net, &batch);
}

#[test]
fn attention_per_sample_gradients_equal_per_example_autograd() {
    // LibTorch\'s generator is global: tests that seed it run one at a time.
    let _serial = common::serial();
    // Example 1 may not attend to its last two positions, example 3 to its first.
    let mask = Tensor::ones([5, 4], (Kind::Bool, Device::Cpu));
    let _ = mask.get(1).narrow(0, 2, 2).fill_(0);
    let _ = mask.get(3).narrow(0, 0, 1).fill_(0);
    let net = AttentionNet::new(4, mask);
    tch::manual_seed(40);
    let xs = Tensor::randn([5, 4, 5], (Kind::Double, Device::Cpu));
    let index = Tensor::arange(5, (Kind::Double, Device::Cpu));
    xs.select(2, 0).select(1, 0).copy_(&index);
    let batch = Batch {
        features: Features::Rows(xs),
        labels: Tensor::from_slice(&[1i64, 0, 2, 2, 1]),
    };
    check_against_per_example_autograd(&net, &batch);
    // The mask matters: without it the logits change.
    let masked = net.forward(&batch.features, &mut Ctx::eval()).unwrap();
    let open = AttentionNet::new(4, Tensor::ones([5, 4], (Kind::Bool, Device::Cpu)));
    let unmasked = open.forward(&batch.features, &mut Ctx::eval()).unwrap();
    assert!(max_rel_diff(&masked.get(1), &unmasked.get(1)) > 1e-6);
    assert!(max_rel_diff(&masked.get(0), &unmasked.get(0)) < 1e-12);
}

#[test]
fn attention_refuses_heads_that_do_not_divide_the_width() {
    // LibTorch\'s generator is global: tests that seed it run one at a time.
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let config = |heads, dropout| AttentionConfig { heads, dropout };
    let err = MultiheadAttention::new(&vs.root(), 8, config(3, 0.0)).unwrap_err();
    assert!(err.to_string().starts_with("heads:"), "{err}");
    let err = MultiheadAttention::new(&vs.root(), 8, config(2, 1.0)).unwrap_err();
    assert!(err.to_string().starts_with("dropout:"), "{err}");
}
